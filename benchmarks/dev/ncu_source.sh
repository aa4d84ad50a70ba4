#!/usr/bin/env bash
# GPU machine, from the repository root: per-instruction (SASS) stall samples of one kernel,
# so that stalls can be tied to instructions (ring barrier waits, scale loads, WGMMA waits).
# The arguments are those of `benchmarks/dev/profile_gemm.py` (default: the dispatched linear
# at (18432, 7168), M = 16). Nsight Compute --set full with unlocked clocks, then its source
# page as CSV and the 40 most sampled instructions with their top 3 stall reasons. Output
# under $OUT/src (or ./ncu_out/src). NCU_SKIP: launches of W4A16 kernels skipped before the
# profiled one (default 2: the second linear call, or GEMM 1 of the second moe call; 3 for
# that call's GEMM 2). Usage:
#   source .device/prelude.sh && bash benchmarks/dev/ncu_source.sh [linear 18432 7168 16]
set -u
out="${OUT:-ncu_out}/src"
mkdir -p "$out"
NCU="${NCU:-/usr/local/cuda/bin/ncu}"
export NVFP4_OPS_CACHE_DIR="${NVFP4_OPS_CACHE_DIR:-/tmp/nvfp4_cache}"
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(linear 18432 7168 16)
skip="${NCU_SKIP:-2}"
name="$(IFS=_; echo "${args[*]}" | tr -c 'A-Za-z0-9_.\n-' '_')_skip$skip"
timeout -s KILL 300 "$NCU" --clock-control none --kernel-name regex:W4A16 --launch-skip "$skip" \
  --launch-count 1 --set full -f -o "/tmp/$name" \
  python3 benchmarks/dev/profile_gemm.py "${args[@]}" > "$out/${name}_prof.txt" 2>&1
echo "$name profile rc=$?"
"$NCU" -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass \
  > "$out/${name}_sass.csv" 2> "$out/${name}_sass.err"
echo "$name source rc=$? lines=$(wc -l < "$out/${name}_sass.csv")"
python3 - "$out/${name}_sass.csv" <<'PY'
import csv, pathlib, sys
f = pathlib.Path(sys.argv[1])
rows = list(csv.reader(f.open()))
if len(rows) < 3:
    sys.exit(f"{f}: no source rows")
hdr, data = rows[1], rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
num = lambda r, h: int(r[ix[h]] or 0)
total = sum(num(r, "# Samples") for r in data)
lines = [f"{f.stem}: {total} samples"]
for r in sorted(data, key=lambda r: -num(r, "# Samples"))[:40]:
    n = num(r, "# Samples")
    top = sorted(((num(r, h), h[6:]) for h in reasons), reverse=True)[:3]
    lines.append(f"{r[0][-5:]} {n:6d} {100 * n / total:5.1f}% "
                 f"ex={r[ix['Instructions Executed']]:>7} {r[1].strip()[:60]:60s} {top}")
(f.parent / f"{f.stem}_top.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines[:12]))
PY
