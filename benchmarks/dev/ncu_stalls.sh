#!/usr/bin/env bash
# GPU machine, from the repository root: where the dense linear's warps wait. For each case
# "N K M" (default: both large DeepSeek-V4 shapes at M = 1 and 16), Nsight Compute (clocks not
# locked) on the dispatched kernel of `profile_gemm.py linear` (prepared weights): speed of
# light, compute, scheduler, warp-state and occupancy sections, then every per-reason stall
# ratio and pipe utilisation as raw metrics, and a summary of the top stall reasons per case.
# Output under $OUT/ncu (or ./ncu_out). Usage:
#   source .device/prelude.sh && bash benchmarks/dev/ncu_stalls.sh ["7168 18432 16" ...]
set -u
out="${OUT:-ncu_out}/ncu"
mkdir -p "$out"
NCU="${NCU:-/usr/local/cuda/bin/ncu}"
export NVFP4_OPS_CACHE_DIR="${NVFP4_OPS_CACHE_DIR:-/tmp/nvfp4_cache}"
SECS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy"
METS='regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,regex:^sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active$,regex:^sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active$'
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=("7168 18432 1" "7168 18432 16" "18432 7168 1" "18432 7168 16")
for c in "${cases[@]}"; do
  name="m$(echo "$c" | awk '{print $3 "_" $1 "_" $2}')"
  # shellcheck disable=SC2086  # the case is three words on purpose
  timeout -s KILL 120 "$NCU" --clock-control none --kernel-name regex:W4A16 --launch-skip 2 \
    --launch-count 1 $SECS --print-details all \
    python3 benchmarks/dev/profile_gemm.py linear $c > "$out/${name}_sec.txt" 2>&1
  echo "$name sections rc=$?"
  # shellcheck disable=SC2086
  timeout -s KILL 120 "$NCU" --clock-control none --kernel-name regex:W4A16 --launch-skip 2 \
    --launch-count 1 --metrics "$METS" \
    python3 benchmarks/dev/profile_gemm.py linear $c > "$out/${name}_met.txt" 2>&1
  echo "$name metrics rc=$?"
done
python3 - "$out" <<'PY'
import pathlib, re, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*_met.txt")):
    stalls, pipes = [], []
    for line in f.read_text().splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        m = re.match(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio", parts[0])
        if m:
            stalls.append((float(parts[-1].replace(",", "")), m.group(1)))
        m = re.match(r"sm__(pipe_\w+|inst_executed_pipe_\w+)\.avg", parts[0])
        if m:
            pipes.append((float(parts[-1].replace(",", "")), m.group(1)))
    print(f"== {f.stem}")
    print("  stalls per issued instruction: " + ", ".join(
        f"{n} {v:.2f}" for v, n in sorted(stalls, reverse=True)[:8]))
    print("  busiest pipes (% of peak): " + ", ".join(
        f"{n} {v:.1f}" for v, n in sorted(pipes, reverse=True)[:6]))
PY
for f in "$out"/*_sec.txt; do
  echo "== $(basename "$f")"
  grep -E "W4A16|Duration|SM Frequency|Issue Slots Busy|Eligible Warps|No Eligible|Warp Cycles Per Issued|Achieved Active Warps" "$f" | head -12
done
