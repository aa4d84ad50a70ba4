# session 15, call 5: block scales converted a stage ahead (scale_lsu + scale_ahead)
set -u
source .device/prelude.sh
timeout -s KILL 400 python3 benchmarks/dev_ab_wfrag.py --sweep box --flush read --nk 7168x18432 18432x7168 --ms 16 32 128 --rounds 3 --jobs 16 > $OUT/box_ahead.log 2>&1; echo "box rc=$?"
grep -v "^\s*$" $OUT/box_ahead.log | grep -v "compiled, worker" | grep -v "^  \(natural\|wfrag\|wgmma r1\)" | tail -50
