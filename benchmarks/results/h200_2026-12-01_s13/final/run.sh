#!/usr/bin/env bash
# Session 13's last device call (carry .device and .baseline = `git archive fee4161 nvfp4_ops`):
# a second bench_linear --check of this tree, then the MoE per-stage split at T = 4096
# (bench_moe --sweep) of this tree and of session 8's (PYTHONPATH=.baseline first).
set -u
export NVFP4_OPS_CACHE_DIR=/tmp/nvfp4_cache PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
timeout 130 python3 benchmarks/bench_linear.py --check --out $L/linear_r2.json > $L/bench_linear_r2.log 2>&1 || echo "linear r2 failed"
grep -E "^ +(1|16|128|8192) +(7168|18432)" $L/bench_linear_r2.log
for t in main s8; do
  case $t in main) pp= ;; s8) pp=$PWD/.baseline ;; esac
  env PYTHONPATH=$pp${pp:+:}${PYTHONPATH:-} timeout 90 python3 benchmarks/bench_moe.py --tokens 4096 --no-baseline --sweep \
    --out $L/moe_sweep_${t}.json > $L/moe_sweep_${t}.log 2>&1 || echo "moe sweep $t failed"
  echo "== moe sweep $t"; tail -12 $L/moe_sweep_${t}.log
done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
