# session 15, call 9: GPU tests of the new stream-K cases (scales ahead, launch overlap, a
# two-linear chain in a CUDA graph), then bench_linear, alternating two rounds:
#   memset  = fresh zeroed counters per call, no launch overlap (call 7's "new")
#   reuse   = counters reused (linear_cuda.streamk_counters), no launch overlap
#   pdl     = counters reused + launch overlap (the dispatch of this tree)
# (NVFP4_DEV_NOPDL was a temporary switch in linear_cuda._streamk_tile)
set -u
source .device/prelude.sh
timeout -s KILL 240 python3 -m pytest -q -m gpu tests/test_streamk.py -k "scale_ahead or pdl or chain" -p no:cacheprovider > $OUT/pytest_streamk.log 2>&1; echo "pytest rc=$?"
tail -3 $OUT/pytest_streamk.log
for r in 1 2; do
  for t in memset reuse pdl; do
    case $t in memset) env_=(NVFP4_OPS_STREAMK_COUNTERS=per-call NVFP4_DEV_NOPDL=1) ;;
               reuse) env_=(NVFP4_DEV_NOPDL=1) ;; pdl) env_=() ;; esac
    env "${env_[@]}" timeout -s KILL 100 python3 benchmarks/bench_linear.py --check --ms 16,32,128 --nks 7168x18432,18432x7168 > $OUT/bench_${t}_$r.log 2>&1
    echo "bench $t $r rc=$?"
  done
done
for f in $OUT/bench_*.log; do echo "== $(basename $f)"; grep -A7 "M     N     K" $f | tail -6; done
