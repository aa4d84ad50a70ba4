#!/usr/bin/env bash
# A/B of three nvfp4_ops trees under bench_linear's method (rotating weight sets, graphs)
# main = .baseline (908ff94), t2 = .base_t2 (de36120), pf = the working tree (cedc015)
set -u
export NVFP4_OPS_CACHE_DIR=/tmp/nvfp4_cache PYTHONUNBUFFERED=1
for r in 1 2 3; do
  for t in main t2 pf; do
    case $t in main) pp=$PWD/.baseline ;; t2) pp=$PWD/.base_t2 ;; pf) pp= ;; esac
    env PYTHONPATH=$pp${pp:+:}${PYTHONPATH:-} timeout 150 python3 benchmarks/bench_linear.py \
      --ms 1,8 --out $OUT/ab_${t}_r$r.json > $OUT/ab_${t}_r$r.log 2>&1 || echo "$t r$r failed"
    echo "== $t r$r"; grep -E "^ +(1|8) " $OUT/ab_${t}_r$r.log
  done
done
