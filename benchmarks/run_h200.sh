#!/usr/bin/env bash
# GPU validation on an H200: every GPU test, the check CLI on V4-Flash, and both benchmarks.
# Logs and JSON go to ${OUT:-benchmarks/results/run}. Run from the repo root with the CuTeDSL
# toolchain importable (on the lent machine: source .device/prelude.sh first).
#   bash benchmarks/run_h200.sh          # all of it in one call (~7 min with 56 variants)
#   bash benchmarks/run_h200.sh tests    # precompile + every GPU test
#   bash benchmarks/run_h200.sh bench    # precompile + check + bench_linear + bench_moe
# (two calls when the variant count or the test count grows past one 10-minute call; each
# precompiles, since a fresh machine has no kernel cache).
# Every step has its own time limit, so a hung kernel costs one step, not the whole call.
set -uo pipefail
phase="${1:-all}"
case "$phase" in all | tests | bench) ;; *) echo "usage: $0 [all|tests|bench]" >&2; exit 2 ;; esac
out="${OUT:-benchmarks/results/run}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NVFP4_OPS_CACHE_DIR="${NVFP4_OPS_CACHE_DIR:-/tmp/nvfp4_cache}"
limit=150; test_limit=270
# one phase per call: precompile with 8 workers takes well under its limit, which leaves the
# GPU tests (some compile their own test-shape configs) most of the 10-minute call
if [ "$phase" != all ]; then limit=120; test_limit=450; fi
# 8 compile workers first (precompile --jobs), then load + run each variant once
timeout $limit python3 -m nvfp4_ops precompile --shape v4-flash --shape v4-pro --jobs 8 2>&1 \
  | tail -3 \
  | tee "$out/precompile.log"
if [ "$phase" != bench ]; then
  timeout $test_limit python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 \
    | tee "$out/gpu_pytest.log" | tail -4
fi
if [ "$phase" != tests ]; then
  timeout 60 python3 -m nvfp4_ops check --shape v4-flash --tokens 64 2>&1 \
    | tee "$out/check_v4-flash.log" | tail -8
  # the prepared (wfrag) weights the vLLM glue runs on CUDA, then the checkpoint order
  timeout 100 python3 benchmarks/bench_linear.py --out "$out/linear_h200.json" 2>&1 \
    | tee "$out/bench_linear.log" | tail -24
  timeout 100 python3 benchmarks/bench_linear.py --weight-order checkpoint \
    --out "$out/linear_h200_checkpoint.json" 2>&1 | tee "$out/bench_linear_checkpoint.log" | tail -22
  timeout 150 python3 benchmarks/bench_moe.py --shapes v4-flash --out "$out/moe_h200_v4-flash.json" \
    2>&1 | tee "$out/bench_moe.log" | tail -12
fi
