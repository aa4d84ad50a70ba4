# session 14: the dispatch with lite_fixup + stage_scales (128-k stream-K tiles): GPU tests of
# every dispatched dense config, then bench_linear --check (run 1). Carry .device.
set -u
source .device/prelude.sh
export NVFP4_OPS_CACHE_DIR=/tmp/nvfp4_cache PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
timeout -s KILL 290 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_linear_gpu.py tests/test_wfrag.py > $L/gpu_pytest_linear.log 2>&1
tail -3 $L/gpu_pytest_linear.log
timeout -s KILL 130 python3 benchmarks/bench_linear.py --check --out $L/linear_r1.json > $L/bench_linear_r1.log 2>&1 || echo "bench failed"
tail -24 $L/bench_linear_r1.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
