set -u
source .device/prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout -s KILL 330 python3 benchmarks/dev_ab_wfrag.py --sweep box --flush read --nk 7168x18432 18432x7168 --ms 13 16 32 --rounds 3 --jobs 16 > $OUT/box_lsu.log 2>&1; echo "box rc=$?"
timeout -s KILL 150 python3 benchmarks/bench_linear.py --check --ms 16,128 --nks 7168x18432,18432x7168 > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -v "^\s*$" $OUT/box_lsu.log | tail -45
tail -15 $OUT/bench.log
