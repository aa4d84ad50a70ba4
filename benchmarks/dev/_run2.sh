source .device/prelude.sh
export NVFP4_OPS_CACHE_DIR=/tmp/c TRITON_CACHE_DIR=/tmp/tc NVFP4_OPS_COMMIT=b6cdf24
bash benchmarks/dev/gpu_suite.sh setup moe
timeout -s KILL 330 python3 benchmarks/bench_moe.py --shapes v4-flash v4-pro --ep 1 8 --format nvfp4 --check --time-limit 300 --out-dir $OUT > $OUT/bench_moe_matrix.log 2>&1; echo "bench rc=$?"; grep -A80 "^summary\|ratio" $OUT/bench_moe_matrix.log | head -5; tail -75 $OUT/bench_moe_matrix.log | cut -c1-150
