#!/usr/bin/env bash
# main = this tree (f1e... the final dispatch), s8 = .baseline (fee4161, session 8's bench commit)
set -u
export NVFP4_OPS_CACHE_DIR=/tmp/nvfp4_cache PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
for r in 1 2; do
  timeout 150 python3 benchmarks/bench_linear.py --check --out $L/linear_r$r.json > $L/bench_linear_r$r.log 2>&1 || echo "linear r$r failed"
done
tail -22 $L/bench_linear_r1.log; grep -E "^ +(1|16|128|8192) +(7168|18432)" $L/bench_linear_r2.log
for r in 1 2 3; do
  for t in main s8; do
    case $t in main) pp= ;; s8) pp=$PWD/.baseline ;; esac
    env PYTHONPATH=$pp${pp:+:}${PYTHONPATH:-} timeout 200 python3 benchmarks/bench_moe.py --tokens 4096 --no-baseline \
      --out $L/moe_${t}_r$r.json > $L/moe_${t}_r$r.log 2>&1 || echo "moe $t r$r failed"
    echo "== moe $t r$r"; tail -4 $L/moe_${t}_r$r.log
  done
done
tar -C $OUT -czf $OUT/logs.tgz logs && rm -rf $L
