"""The README's MoE tables from `bench_moe.py` JSON, and how many cells meet each target.

Reads `bench_moe_{nvfp4,mxfp4}_{shape}.json` (written by `python benchmarks/bench_moe.py
--format nvfp4 mxfp4 --out-dir DIR`) and prints, per shape, the README's markdown table (µs
of the uniform EP 1 row, ratios against Humming and bf16 per routing and EP slice), then a
summary: cells ahead of Humming, cells at 1.2× or more, the cells behind, the share of the
roofline 1.2× Humming would take in the cells short of it (the eight highest), the absolute
targets (V4-Flash T = 1 / 8 µs, EP 8 roofline share) and the MXFP4 cells slower than NVFP4
in the same run. With ``--detail``, the results README's per-shape tables instead. No GPU.

    python benchmarks/dev/moe_tables.py --dir benchmarks/results [--detail]
"""

from __future__ import annotations

import argparse
import json
import os


def _load(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    return {(r["ep"], r["routing"], r["T"]): r for r in data["rows"]}


def _ratio(row: dict | None, key: str) -> str:
    value = None if row is None else row.get(key)
    return "-" if value is None else f"{value:.2f}×"


def _us(value: float | None, whole_from: float = 1000) -> str:
    """µs with one decimal below ``whole_from``, whole above (the README's short table: 100)."""
    return "-" if value is None else f"{value:.1f}" if value < whole_from else f"{value:.0f}"


def table(shape: str, nv: dict, mx: dict | None) -> list[str]:
    """The README's markdown table of one shape."""
    tokens = sorted({t for _, _, t in nv})
    head = [f"| {shape.title()} | " + " | ".join(
        ("T = " if i == 0 else "") + str(t) for i, t in enumerate(tokens)) + " |",
        "|---" * (len(tokens) + 1) + "|"]
    us = [_us(None if (row := nv.get((1, "uniform", t))) is None else row.get("ours_us"),
              whole_from=100) for t in tokens]
    lines = head + ["| µs, uniform | " + " | ".join(us) + " |"]
    rows = [("vs Humming, uniform", nv, (1, "uniform"), "speedup_vs_humming"),
            ("vs Humming, skewed (Zipf 1.2)", nv, (1, "skew"), "speedup_vs_humming"),
            ("vs Humming, one EP 8 rank, uniform", nv, (8, "uniform"), "speedup_vs_humming"),
            ("vs Humming, one EP 8 rank, skewed", nv, (8, "skew"), "speedup_vs_humming")]
    if mx is not None:
        rows += [("MXFP4 vs Humming's MXFP4, uniform", mx, (1, "uniform"), "speedup_vs_humming"),
                 ("MXFP4 vs Humming's MXFP4, skewed", mx, (1, "skew"), "speedup_vs_humming")]
    rows.append(("vs bf16, uniform", nv, (1, "uniform"), "speedup_vs_bf16"))
    for label, cells, (ep, routing), key in rows:
        lines.append(f"| {label} | " + " | ".join(
            _ratio(cells.get((ep, routing, t)), key) for t in tokens) + " |")
    return lines


def detail(nv: dict, mx: dict | None) -> list[str]:
    """The results README's table of one shape: per EP slice and routing, ours and Humming
    in µs, the ratios, the roofline share, the token tile (``+`` the hot tile) and the MXFP4
    rows."""
    tokens = sorted({t for _, _, t in nv})
    lines = ["| T | " + " | ".join(map(str, tokens)) + " |", "|---" * (len(tokens) + 1) + "|"]

    def add(label: str, cells: dict, ep: int, routing: str, cell) -> None:
        lines.append(f"| EP {ep}, {routing}: {label} | " + " | ".join(
            "-" if (row := cells.get((ep, routing, t))) is None else cell(row)
            for t in tokens) + " |")

    def pct(row: dict) -> str:
        value = row.get("ours_pct_roofline")
        return "–" if not row.get("local_rows") or value is None else f"{value:.0f}"

    def tile(row: dict) -> str:
        hot = row.get("ours_hot_block_m")
        return f"{row['ours_block_m']}" + (f"+{hot}" if hot else "")

    for ep in sorted({k[0] for k in nv}):
        for routing in ("uniform", "skew"):
            add("ours µs", nv, ep, routing, lambda r: _us(r.get("ours_us")))
            add("Humming µs", nv, ep, routing, lambda r: _us(r.get("humming_us")))
            add("**ours vs Humming**", nv, ep, routing,
                lambda r: _ratio(r, "speedup_vs_humming"))
            add("vs bf16", nv, ep, routing, lambda r: _ratio(r, "speedup_vs_bf16"))
            add("% of roofline", nv, ep, routing, pct)
            add("tile", nv, ep, routing, tile)
            if mx is not None:
                add("MXFP4: ours µs", mx, ep, routing, lambda r: _us(r.get("ours_us")))
                add("MXFP4: **vs Humming MXFP4**", mx, ep, routing,
                    lambda r: _ratio(r, "speedup_vs_humming"))
                add("MXFP4: NVFP4 time / MXFP4 time", mx, ep, routing,
                    lambda r: "-" if r.get("speedup_vs_ours_nvfp4") is None
                    else f"{r['speedup_vs_ours_nvfp4']:.2f}")
    return lines


def summary(name: str, cells: dict) -> list[str]:
    """Counts against Humming, and the cells behind it."""
    ratios = {k: r["speedup_vs_humming"] for k, r in cells.items()
              if r.get("speedup_vs_humming") is not None}
    behind = sorted((k, v) for k, v in ratios.items() if v < 1.0)
    out = [f"{name}: ahead of Humming in {sum(v > 1.0 for v in ratios.values())} of "
           f"{len(ratios)} cells, 1.2x or more in {sum(v >= 1.2 for v in ratios.values())}"]
    out += [f"  behind: EP {ep} {routing} T = {t}: {v:.2f}x" for (ep, routing, t), v in behind]
    out += needed(cells)
    return out


def needed(cells: dict, lead: float = 1.2) -> list[str]:
    """What ``lead`` x Humming would take where ours is short of it: the share of the cell's
    roofline (``bench_moe``'s ``*_pct_roofline``: touched weight bytes at 4.1 TB/s or FLOPs
    at 790 TFLOP/s) that a time of Humming's / ``lead`` reaches, against the share ours and
    Humming reach now: how close to the memory (or tensor) ceiling the target sits, not only
    how far ours is from it."""
    short = sorted(((k, r) for k, r in cells.items()
                    if r.get("speedup_vs_humming") is not None
                    and r.get("humming_pct_roofline") and r.get("ours_pct_roofline")
                    and r["speedup_vs_humming"] < lead),
                   key=lambda kr: -lead * kr[1]["humming_pct_roofline"])
    if not short:
        return []
    out = [f"  {lead}x Humming, where not met ({len(short)} cells): % of the roofline it takes"
           f" (ours now, Humming now)"]
    # a time of Humming's / lead reaches lead times Humming's share of the roofline
    out += [f"    EP {ep} {routing} T = {t}: {lead * r['humming_pct_roofline']:.0f} % "
            f"({r['ours_pct_roofline']:.0f}, {r['humming_pct_roofline']:.0f})"
            for (ep, routing, t), r in short[:8]]
    return out


def targets(shape: str, cells: dict) -> list[str]:
    """Issue #21's absolute targets on these cells: V4-Flash EP 1 uniform T = 1 <= 30 µs and
    T = 8 <= 170 µs; every EP 8 cell at T >= 512 at 60 % of its roofline or more."""
    out = []
    if shape == "v4-flash":
        for t, limit in ((1, 30.0), (8, 170.0)):
            row = cells.get((1, "uniform", t))
            if row is not None and row.get("ours_us") is not None:
                verdict = "met" if row["ours_us"] <= limit else "not met"
                out.append(f"  target T = {t} <= {limit:.0f} us: {row['ours_us']:.1f} us, "
                           f"{verdict}")
    short = sorted((k, r["ours_pct_roofline"]) for k, r in cells.items()
                   if k[0] == 8 and k[2] >= 512 and r.get("ours_pct_roofline") is not None
                   and r["ours_pct_roofline"] < 60)
    out.append(f"  target EP 8, T >= 512 at >= 60 % of the roofline: {len(short)} cells short"
               + "".join(f"\n    {routing} T = {t}: {pct:.0f} %" for (_, routing, t), pct in short))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default="benchmarks/results",
                        help="the folder with bench_moe_*.json")
    parser.add_argument("--shapes", nargs="+", default=["v4-flash", "v4-pro"])
    parser.add_argument("--detail", action="store_true",
                        help="the results README's per-shape tables instead (every EP slice "
                             "and routing: µs, ratios, roofline share, tile, MXFP4)")
    args = parser.parse_args()
    notes = []
    for shape in args.shapes:
        nv_path = os.path.join(args.dir, f"bench_moe_nvfp4_{shape}.json")
        mx_path = os.path.join(args.dir, f"bench_moe_mxfp4_{shape}.json")
        nv = _load(nv_path)
        mx = _load(mx_path) if os.path.exists(mx_path) else None
        if args.detail:
            print(f"{shape}:", *detail(nv, mx), sep="\n", end="\n\n")
            continue
        print("\n".join(table(shape, nv, mx)), end="\n\n")
        notes += summary(f"{shape} nvfp4", nv)
        notes += targets(shape, nv)
        if mx is not None:
            notes += summary(f"{shape} mxfp4", mx)
            slower = sorted((k, r["speedup_vs_ours_nvfp4"]) for k, r in mx.items()
                            if r.get("speedup_vs_ours_nvfp4") is not None
                            and r["speedup_vs_ours_nvfp4"] < 1.0)
            notes.append(f"{shape} mxfp4 slower than nvfp4 in {len(slower)} of {len(mx)} cells"
                         + "".join(f"\n  EP {ep} {routing} T = {t}: {v:.3f}x"
                                   for (ep, routing, t), v in slower))
    print("\n".join(notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
