# session 15, call 2: one-warp producer (WgmmaConfig.lean) at 3-5 CTAs per SM, M = 16 / 32
set -u
source .device/prelude.sh
timeout -s KILL 400 python3 benchmarks/dev_ab_wfrag.py --sweep box --flush read --nk 7168x18432 18432x7168 --ms 16 32 --rounds 3 --jobs 16 > $OUT/box_lean.log 2>&1; echo "box rc=$?"
grep -v "^\s*$" $OUT/box_lean.log | grep -v "compiled, worker" | tail -60
