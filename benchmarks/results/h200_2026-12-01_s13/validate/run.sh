set -u
export NVFP4_OPS_CACHE_DIR=/tmp/nvfp4_cache PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_streamk.py tests/test_wfrag.py tests/test_linear_gpu.py > $L/gpu_pytest_linear.log 2>&1
tail -3 $L/gpu_pytest_linear.log
timeout 150 python3 benchmarks/bench_linear.py --check --out $L/linear_r1.json > $L/bench_linear_r1.log 2>&1 || echo "bench failed"
tail -24 $L/bench_linear_r1.log
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
