# session 15, call 8: bench_linear with the stream-K counters zeroed per call (torch.zeros, a
# memset node per call in the graph: the shipped way) vs one cached buffer the kernel leaves
# at zero (NVFP4_DEV_PERSIST=1, a temporary patch: persist.patch), alternating, two rounds
set -u
source .device/prelude.sh
for r in 1 2; do
  for t in memset persist; do
    case $t in memset) ev= ;; persist) ev=1 ;; esac
    env NVFP4_DEV_PERSIST=$ev timeout -s KILL 120 python3 benchmarks/bench_linear.py --check --ms 16,32,128 --nks 7168x18432,18432x7168 > $OUT/bench_${t}_$r.log 2>&1
    echo "bench $t $r rc=$?"
  done
done
for f in $OUT/bench_*.log; do echo "== $(basename $f)"; grep -A7 "M     N     K" $f | tail -6; done
