#!/usr/bin/env bash
# Device (H200), from the project root: where the dense linear's warps wait. ncu (clocks not
# locked) of the dispatched kernel at M = 1 (streamed, TMA tensor copies) and M = 16 (stream-K
# WGMMA) on both issue #3 shapes: speed of light, scheduler and warp-state sections, then every
# per-reason stall ratio and pipe utilisation as raw metrics; last, the top stall reasons per
# case. Output under $OUT/ncu. Written in session 12, not yet run.
source .device/prelude.sh
export NVFP4_OPS_CACHE_DIR=/tmp/nvfp4_cache
mkdir -p "$OUT/ncu"
NCU=/usr/local/cuda/bin/ncu
SECS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy"
METS='regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,regex:^sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active$,regex:^sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active$'
run() {  # name N K M
  local name=$1; shift
  timeout 120 $NCU --clock-control none --kernel-name regex:W4A16 --launch-skip 2 \
    --launch-count 1 $SECS --print-details all \
    python3 benchmarks/dev_profile.py linear-wfrag "$@" > "$OUT/ncu/${name}_sec.txt" 2>&1
  echo "$name sections rc=$?"
  timeout 120 $NCU --clock-control none --kernel-name regex:W4A16 --launch-skip 2 \
    --launch-count 1 --metrics "$METS" \
    python3 benchmarks/dev_profile.py linear-wfrag "$@" > "$OUT/ncu/${name}_met.txt" 2>&1
  echo "$name metrics rc=$?"
}
run m1_7168 7168 18432 1
run m16_7168 7168 18432 16
run m1_18432 18432 7168 1
run m16_18432 18432 7168 16
python3 - "$OUT/ncu" <<'PY'
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
for f in "$OUT"/ncu/*_sec.txt; do
  echo "== $(basename "$f")"
  grep -E "w4a16|Duration|SM Frequency|Issue Slots Busy|Eligible Warps|No Eligible|Warp Cycles Per Issued|Achieved Active Warps" "$f" | head -12
done
