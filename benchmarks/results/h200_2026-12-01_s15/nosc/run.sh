# session 15, call 4: the 128-k stream-K tile without its per-stage scale path (diagnostics),
# with the scales by cp.async, and M = 1 for reference (same method)
set -u
source .device/prelude.sh
timeout -s KILL 400 python3 benchmarks/dev_ab_wfrag.py --sweep box --flush read --nk 7168x18432 18432x7168 --ms 1 16 --rounds 3 --jobs 16 > $OUT/box_nosc.log 2>&1; echo "box rc=$?"
grep -v "^\s*$" $OUT/box_nosc.log | grep -v "compiled, worker" | tail -50
