#!/usr/bin/env bash
# Device (H200), from the project root: per-instruction (SASS) stall samples of the dense M = 16
# stream-K WGMMA tile at (18432, 7168), shipped and without the decode (decode=0), so the stalls
# can be tied to instructions (the scale loads, the ring waits, wgmma waits). ncu --set full with
# unlocked clocks, then its source page as CSV and a top-40 summary. Output under $OUT/src.
# Session 13 (h200_2026-12-01_s13/ncu_source/).
source .device/prelude.sh
export NVFP4_OPS_CACHE_DIR=/tmp/nvfp4_cache
mkdir -p "$OUT/src"
NCU=/usr/local/cuda/bin/ncu
ONLY=${1:-}  # optional: profile only the cases whose name contains this
prof() {  # name, dev_profile args...
  local name=$1; shift
  [[ -n "$ONLY" && "$name" != *"$ONLY"* ]] && return
  timeout 200 $NCU --clock-control none --kernel-name regex:W4A16 --launch-skip 2 \
    --launch-count 1 --set full -f -o "/tmp/$name" \
    python3 benchmarks/dev_profile.py wgmma "$@" > "$OUT/src/${name}_prof.txt" 2>&1
  echo "$name profile rc=$?"
  $NCU -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/src/${name}_sass.csv" 2> "$OUT/src/${name}_sass.err"
  echo "$name source rc=$? lines=$(wc -l < "$OUT/src/${name}_sass.csv")"
}
# session 13 ran the first two (the 64-k-stage tile, dispatched until then); the third is the
# 128-k-stage tile dispatched since
prof m16 18432 7168 16 16 1 6 3
prof m16_nodec 18432 7168 16 16 1 6 3 decode=0
prof m16_k128 18432 7168 16 16 1 4 3 stage_k=128
# the 40 instructions with the most stall samples per case, with their top 3 reasons
python3 - "$OUT/src" <<'PY'
import csv, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*_sass.csv")):
    rows = list(csv.reader(f.open()))
    if len(rows) < 3:
        continue
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
