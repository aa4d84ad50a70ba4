# session 15, call 6: block scales converted by two spare producer warps (convert_scales)
set -u
source .device/prelude.sh
timeout -s KILL 400 python3 benchmarks/dev_ab_wfrag.py --sweep box --flush read --nk 7168x18432 18432x7168 --ms 13 16 32 --rounds 3 --jobs 16 > $OUT/box_convert.log 2>&1; echo "box rc=$?"
grep -i "wrong\|fail" $OUT/box_convert.log
grep -v "^\s*$" $OUT/box_convert.log | grep -v "compiled, worker" | grep -v "^  \(natural\|wfrag\|wgmma r1\)" | tail -45
