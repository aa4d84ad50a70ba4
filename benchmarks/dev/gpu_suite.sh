#!/usr/bin/env bash
# The GPU suite and the benchmarks, split into parts that each fit one 10-minute device call.
#
# On the GPU machine, from the project root:
#   source .device/prelude.sh && bash benchmarks/dev/gpu_suite.sh PART [PART ...]
# Parts (in the order they are usually run; each appends its logs to $OUT):
#   setup     precompile every variant of the three shapes (MXFP4 ones included) in parallel
#             workers (a warm disk cache makes the later parts load instead of compile);
#             installs .whl/*.whl (humming-kernels for bench_moe) into /tmp/site when present
#   moe       the MoE-side GPU tests: moe, routing, load-time preparation, warm-up,
#             validation, compile / AOT graphs
#   mxfp4     the MXFP4 GPU tests (tests/test_mxfp4_gpu.py)
#   profile   benchmarks/dev/host_split.py: an eager call's host time by function,
#             benchmarks/dev/launch_cost.py: host µs per Triton launch path and torch call, and
#             benchmarks/dev/ab_eager_graph.py: eager calls with and without kept launches and
#             their CUDA graphs
#   dense     the dense GPU tests: linear, wfrag, stream-K
#   eager     bench_overhead.py eager in three fresh processes (overhead_eager_<gpu>.json in $OUT,
#             <gpu> = h100 / h200 from nvidia-smi)
#   overhead  bench_overhead.py eager startup (overhead_<gpu>.json in $OUT)
#   flash     bench_moe.py --shapes v4-flash (NVFP4 and MXFP4, both routings, EP 1 and 8, --check)
#   pro       the same for v4-pro
#   tiles     moe_tiles.py: the whole op at every token tile, both shapes, EP 1, T = 512-16384,
#             uniform and skewed (the data dispatch.MOE_TILE_COST is fitted to)
#   decode    moe_tiles.py --variants at the streamed 8-row tile, both shapes, EP 1 and 8,
#             T = 1-128: each GEMM's consumer warps x ring stages against the planned ones
#             (the decode tile per GPU: run it on an H100 and an H200)
#   unroll    WgmmaConfig.unroll (dispatched for V4-Pro's grouped GEMMs): the op's plan against
#             the same plan with every WGMMA GEMM rolled, and with every one unrolled but
#             V4-Flash's two-row-warpgroup 64-row tile, both shapes, T = 512-16384, both
#             routings, EP 1 and 8; then its GPU test (bitwise the rolled form's outputs)
#   routing   the MoE's decode routing: the one-CTA kernel and the direct kernel
#             (moe_routing.DIRECT_ROUTING) alone at 8 and 4 warps (benchmarks/dev/routing_warps.py
#             --direct), then the whole op in place with each, four processes alternating
#             (moe_timeline.py [--direct-routing]; needs `setup`)
#   rerun     only the tests named in RERUN="file::test ..." (pytest node ids: what a previous
#             part failed)
# The machine's kernel cache lasts only while the machine stays warm (it goes back after a short
# idle time), so a call on a fresh machine names `setup` first (`gpu_suite.sh setup moe`):
# without it each test file compiles its variants inside its own time limit (the MXFP4 file
# alone took more than 250 s so on an H100 and was killed).
# Tests run in XDIST (default 4) pytest-xdist workers. Every pytest and benchmark runs under
# `timeout -s KILL` (a hung kernel must not eat the call); the last lines of each go to
# stdout, the whole log to $OUT. The device tool brings back at most 8 files from $OUT, so
# when the parts wrote more, everything but the JSON is packed into $OUT/gpu_suite_files.tgz
# at the end (logs and plots; `tar xzf` it here). NVFP4_OPS_COMMIT names
# the tree in the benchmark JSON (the machine's copy has no .git).
set -uo pipefail
out="${OUT:-/tmp/gpu_suite}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/humming ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
elif [ -d /tmp/site/humming ]; then
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

tests() {  # tests NAME SECONDS FILE...
  local name=$1 limit=$2
  shift 2
  echo "== pytest $name ($*)"
  # XDIST workers share the one GPU: the tests are mostly host-bound (references, captures)
  timeout -s KILL "$limit" python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
    -n "${XDIST:-4}" "$@" >"$out/pytest_$name.log" 2>&1
  echo "rc=$? $(tail -1 "$out/pytest_$name.log")"
  grep -E "^(FAILED|ERROR)" "$out/pytest_$name.log" | head -20
}

jobs=$(( $(nproc) > 2 ? $(nproc) - 1 : 1 ))
# the GPU's kind in result file names (h100 / h200), as benchmarks/results names them
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
      | grep -oiE 'h100|h200' | tr 'A-Z' 'a-z')
gpu=${gpu:-gpu}
for part in "$@"; do
  start=$(date +%s)
  case "$part" in
    setup)
      # the MXFP4 (UE8M0) variants too, by default: the mxfp4 tests and the benchmarks run them
      timeout -s KILL 400 python3 -m nvfp4_ops precompile \
        --shape v4-flash --shape v4-pro --shape tiny --jobs "$jobs" >"$out/precompile.log" 2>&1
      echo "== setup rc=$? $(tail -1 "$out/precompile.log")" ;;
    moe)
      tests moe 420 tests/test_moe_gpu.py tests/test_moe_routing.py tests/test_prepare.py \
        tests/test_warmup.py tests/test_validation.py tests/test_compile_graph.py \
        tests/test_triton_launch.py ;;
    mxfp4)
      tests mxfp4 360 tests/test_mxfp4_gpu.py ;;
    routing)
      timeout -s KILL 150 python3 benchmarks/dev/routing_warps.py --tokens 1 8 --warps 8 4 \
        --direct >"$out/routing_warps.log" 2>&1
      echo "== routing_warps rc=$?"; grep -vE "^#" "$out/routing_warps.log" | tail -20
      i=0
      for kernel in one-cta direct direct one-cta; do
        i=$((i + 1))
        flag=$([ "$kernel" = direct ] && echo --direct-routing || true)
        # shellcheck disable=SC2086
        timeout -s KILL 120 python3 benchmarks/dev/moe_timeline.py --shapes v4-flash v4-pro \
          --tokens 1 8 --ep 1 8 --reps 40 $flag >"$out/timeline_routing_${i}_$kernel.log" 2>&1
        echo "== timeline $i, $kernel routing: rc=$?"
        grep -E "^v4-|routing:|replay \(CUDA" "$out/timeline_routing_${i}_$kernel.log" | cut -c1-100
      done ;;
    rerun)  # the tests a previous call failed: RERUN="file::test ..." (node ids)
      # shellcheck disable=SC2086
      tests rerun 300 $RERUN ;;
    profile)  # where an eager call spends its host time, function by function; launch costs
      timeout -s KILL 300 python3 benchmarks/dev/host_split.py >"$out/host_split.log" 2>&1
      echo "== profile rc=$?"; cut -c1-110 "$out/host_split.log"
      timeout -s KILL 120 python3 benchmarks/dev/launch_cost.py >"$out/launch_cost.log" 2>&1
      echo "== launch_cost rc=$?"; cat "$out/launch_cost.log"
      timeout -s KILL 240 python3 benchmarks/dev/ab_eager_graph.py >"$out/ab_eager_graph.log" 2>&1
      echo "== ab_eager_graph rc=$?"; cat "$out/ab_eager_graph.log" ;;
    dense)
      tests dense 540 tests/test_linear_gpu.py tests/test_wfrag.py tests/test_streamk.py ;;
    eager)  # the eager half of overhead only
      timeout -s KILL 300 python3 benchmarks/bench_overhead.py eager --processes 3 \
        --out "$out/overhead_eager_$gpu.json" >"$out/bench_overhead_eager.log" 2>&1
      echo "== eager rc=$?"; tail -3 "$out/bench_overhead_eager.log" ;;
    overhead)
      timeout -s KILL 420 python3 benchmarks/bench_overhead.py eager startup --jobs "$jobs" \
        --out "$out/overhead_$gpu.json" >"$out/bench_overhead.log" 2>&1
      echo "== overhead rc=$?"; tail -12 "$out/bench_overhead.log" ;;
    flash|pro)
      shape=$([ "$part" = flash ] && echo v4-flash || echo v4-pro)
      timeout -s KILL 540 python3 benchmarks/bench_moe.py --shapes "$shape" --format nvfp4 mxfp4 \
        --check --time-limit 480 --out-dir "$out" >"$out/bench_moe_$shape.log" 2>&1
      echo "== bench_moe $shape rc=$?"; tail -45 "$out/bench_moe_$shape.log" ;;
    tiles)
      timeout -s KILL 540 python3 benchmarks/dev/moe_tiles.py --shapes v4-pro v4-flash \
        --tokens 512 1024 2048 4096 16384 --routing uniform skew --ep 1 --reps 10 \
        --jobs "$jobs" --time-limit 420 >"$out/moe_tiles.log" 2>&1
      echo "== tiles rc=$?"; grep -E "^(v4|shape)" "$out/moe_tiles.log" | cut -c1-220 ;;
    decode)
      timeout -s KILL 540 python3 benchmarks/dev/moe_tiles.py --shapes v4-flash v4-pro \
        --tokens 1 8 32 128 --routing uniform --ep 1 8 --tiles 8 --variants --reps 20 \
        --jobs "$jobs" --time-limit 420 >"$out/moe_decode_tiles.log" 2>&1
      echo "== decode rc=$?"; grep -E "^(v4|    bm)" "$out/moe_decode_tiles.log" | cut -c1-220 ;;
    unroll)  # the A/B first (its cells are bitwise checked too), then the test: one call
      timeout -s KILL 360 python3 benchmarks/dev/moe_tiles.py --shapes v4-pro v4-flash \
        --tokens 2048 512 4096 16384 --routing uniform skew --ep 1 8 --tiles 1 \
        --op-fields unroll=0 "unroll=1;unroll=0@block_m=64,row_wgs=2" --reps 20 \
        --jobs "$jobs" --time-limit 320 \
        >"$out/ab_unroll.log" 2>&1
      echo "== unroll A/B rc=$?"; grep -E "^v4|op \+" "$out/ab_unroll.log" | cut -c1-160
      tests unroll 200 tests/test_moe_gpu.py -k unrolled ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
  echo "== $part took $(( $(date +%s) - start )) s"
done
if [ "$(find "$out" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  (cd "$out" && find . -maxdepth 1 -type f ! -name '*.json' ! -name gpu_suite_files.tgz \
     -printf '%f\n' | tar czf gpu_suite_files.tgz -T - --remove-files)
  echo "== packed the logs and plots into $out/gpu_suite_files.tgz"
fi
