"""The report of ``bench_moe.py``: one JSON per (weight format, shape), rewritten after every
cell, the tables printed at the end and a PNG per shape and format (µs against T, log-log).
:data:`COLUMNS` says what each row field means (it is written into every JSON).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from nvfp4_ops.shapes import get_shape
from nvfp4_ops.testing import ep_slice

__all__ = ["COLUMNS", "ROUTING_STYLES", "Cell", "Report", "format_table", "num"]


@dataclass(frozen=True)
class Cell:
    """One measurement point of ``bench_moe.py``'s plan (every implementation is timed on the
    same inputs); a report files one row per cell under :attr:`key`."""

    shape: str
    fmt: str
    ep: int
    routing: str
    tokens: int

    @property
    def key(self) -> str:
        return f"ep{self.ep}/{self.routing}/T{self.tokens}"

#: what each JSON row field means
COLUMNS = {
    "ep, expert_start, local_experts": "the EP degree and the rank timed: its first global "
                                       "expert id and its expert count",
    "T, routing": "tokens; uniform or skew (Zipf --skew) top-k routing, global ids",
    "local_rows, touched_experts": "slots routed to local experts; distinct local experts hit",
    "bytes, flops, roofline_us": "weight bytes of the touched local experts (bytes per weight "
                                 "of the format), 6 H I FLOPs per local row, max(bytes / 4.1 "
                                 "TB/s, flops / 790 TFLOP/s) in µs",
    "<impl>_us": "median µs of one call per CUDA-graph replay after a 256 MB read flush "
                 "(ours, humming, bf16)",
    "<impl>_us_runs": "--order abba (ours, Humming, Humming, ours): the two medians, in "
                      "measurement order, whose mean is <impl>_us",
    "<impl>_chained_us": "--chained N: µs per call of a graph of N back-to-back calls "
                         "(throughput, not latency)",
    "<impl>_pct_roofline": "100 * roofline_us / <impl>_us",
    "speedup_vs_<peer>": "<peer>_us / ours_us (> 1: ours faster)",
    "ours_nvfp4_us, speedup_vs_ours_nvfp4": "MXFP4 rows: ours on NVFP4 weights, same cell, same "
                                            "run; its time / ours on MXFP4",
    "ours_block_m": "the token tile our dispatch takes for the cell (dispatch.plan_moe)",
    "humming_gemm": "the Humming MoE GEMM timed (indexed / grouped_contiguous)",
    "check_humming_rel_l2, check_ok": "--check: relative L2 of Humming's output vs ours",
    "stages_us": "--stages: ours' routing / gather / GEMM 1 / GEMM 2 / combine, each timed alone",
    "errors": "implementation -> the error that kept it from this cell",
}

#: the routings a report orders its tables by, and their line style in the plots
ROUTING_STYLES = {"uniform": "-", "skew": "--"}


def _log(msg: str) -> None:
    print(msg, flush=True)


class Report:
    """Rows per (format, shape), each JSON file rewritten after every update."""

    def __init__(self, out_dir: Path, meta: dict, plan: list[Cell]) -> None:
        self.out_dir = out_dir
        self.meta = meta
        self.docs: dict[tuple[str, str], dict] = {}
        self.formats = {c.shape: [] for c in plan}
        for c in plan:
            if c.fmt not in self.formats[c.shape]:
                self.formats[c.shape].append(c.fmt)
        self.check_failed = False

    def _doc(self, fmt: str, shape: str) -> dict:
        if (fmt, shape) not in self.docs:
            self.docs[(fmt, shape)] = {
                "benchmark": "bench_moe", "format": fmt, "shape": asdict(get_shape(shape)),
                "meta": self.meta, "columns": COLUMNS, "rows": {}, "notes": []}
        return self.docs[(fmt, shape)]

    def row(self, cell: Cell) -> dict:
        rows = self._doc(cell.fmt, cell.shape)["rows"]
        if cell.key not in rows:
            shape = get_shape(cell.shape)
            start, local = ep_slice(shape.experts, cell.ep)
            rows[cell.key] = {"shape": cell.shape, "format": cell.fmt, "ep": cell.ep,
                              "expert_start": start, "local_experts": local,
                              "routing": cell.routing, "T": cell.tokens, "errors": {}}
        return rows[cell.key]

    def set(self, cell: Cell, **fields) -> dict:
        row = self.row(cell)
        errors = fields.pop("errors", {})
        row.update(fields)
        row["errors"].update(errors)
        self._derive(row)
        if fields.get("check_ok") is False:
            self.check_failed = True
        self.write(cell.fmt, cell.shape)
        return row

    def note(self, fmt: str | None, shape: str, msg: str) -> None:
        _log(msg)
        for f in [fmt] if fmt else self.formats.get(shape, ["nvfp4"]):
            self._doc(f, shape)["notes"].append(msg)
            self.write(f, shape)

    def _derive(self, row: dict) -> None:
        ours = row.get("ours_us")
        roof = row.get("roofline_us")
        for impl in ("ours", "humming", "bf16"):
            t = row.get(f"{impl}_us")
            if t and roof:
                row[f"{impl}_pct_roofline"] = 100.0 * roof / t
        for peer in ("humming", "bf16"):
            t = row.get(f"{peer}_us")
            row[f"speedup_vs_{peer}"] = t / ours if t and ours else None
        if row["format"] == "mxfp4":
            nv = self.docs.get(("nvfp4", row["shape"]), {}).get("rows", {})
            key = f"ep{row['ep']}/{row['routing']}/T{row['T']}"
            t_nv = nv.get(key, {}).get("ours_us")
            row["ours_nvfp4_us"] = t_nv
            row["speedup_vs_ours_nvfp4"] = t_nv / ours if t_nv and ours else None

    def path(self, fmt: str, shape: str, suffix: str) -> Path:
        return self.out_dir / f"bench_moe_{fmt}_{shape}{suffix}"

    def write(self, fmt: str, shape: str) -> None:
        doc = dict(self._doc(fmt, shape))
        doc["rows"] = sorted(doc["rows"].values(),
                             key=lambda r: (r["ep"], r["routing"], r["T"]))
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.path(fmt, shape, ".json")
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(path)

    def finish(self) -> None:
        for (fmt, shape), doc in self.docs.items():
            for row in doc["rows"].values():
                self._derive(row)
            self.write(fmt, shape)

    def tables(self) -> str:
        out = []
        fake = " [FAKE timings]" if self.meta.get("fake") else ""
        for (fmt, shape), doc in self.docs.items():
            rows = list(doc["rows"].values())
            for ep in sorted({r["ep"] for r in rows}):
                for routing in [x for x in ROUTING_STYLES if any(r["routing"] == x for r in rows)]:
                    sel = sorted((r for r in rows if r["ep"] == ep and r["routing"] == routing),
                                 key=lambda r: r["T"])
                    if sel:
                        out.append(format_table(shape, fmt, ep, routing, sel) + fake)
        return "\n\n".join(out)

    def plots(self) -> list[Path]:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as exc:
            _log(f"plots skipped: matplotlib not importable ({exc})")
            return []
        paths = []
        for (fmt, shape), doc in self.docs.items():
            rows = list(doc["rows"].values())
            eps = sorted({r["ep"] for r in rows})
            if not rows:
                continue
            try:
                fig, axes = plt.subplots(1, len(eps), figsize=(6.4 * len(eps), 4.6), dpi=110,
                                         squeeze=False)
                for ax, ep in zip(axes[0], eps, strict=True):
                    _plot_panel(ax, [r for r in rows if r["ep"] == ep], ep, fmt)
                gpu = self.meta.get("gpu", "GPU")
                fig.suptitle(f"MoE {shape} {fmt.upper()} on {gpu} (one call per CUDA-graph "
                             "replay, L2 flushed by a read, medians)", fontsize=9)
                fig.tight_layout()
                path = self.path(fmt, shape, ".png")
                fig.savefig(path)
                plt.close(fig)
                paths.append(path)
            except Exception as exc:  # noqa: BLE001 - the JSON and tables are written already
                _log(f"plot {fmt} {shape} failed: {type(exc).__name__}: {exc}")
        return paths


def _plot_panel(ax, rows: list[dict], ep: int, fmt: str) -> None:
    colors = {"ours": "tab:green", "humming": "tab:blue", "bf16": "tab:gray"}
    labels = {"ours": "nvfp4-ops", "humming": "Humming 0.1.19", "bf16": "bf16 _grouped_mm"}
    for routing, style in ROUTING_STYLES.items():
        sel = sorted((r for r in rows if r["routing"] == routing), key=lambda r: r["T"])
        if not sel:
            continue
        for impl in ("ours", "humming", "bf16"):
            pts = [(r["T"], r[f"{impl}_us"]) for r in sel if r.get(f"{impl}_us")]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="o", ms=3,
                        color=colors[impl], label=f"{labels[impl]} ({routing})")
        pts = [(r["T"], r["roofline_us"]) for r in sel if r.get("roofline_us")]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, color="black", lw=0.8, alpha=0.5,
                    label=f"roofline ({routing})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens T")
    ax.set_ylabel("µs per MoE call")
    local = rows[0]["local_experts"] if rows else "?"
    ax.set_title(f"EP {ep} ({local} local experts), {fmt.upper()}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)


def num(value, fmt: str = "9.1f", width: int = 9) -> str:
    return f"{value:{fmt}}" if isinstance(value, (int, float)) else f"{'-':>{width}s}"


def format_table(shape: str, fmt: str, ep: int, routing: str, rows: list[dict]) -> str:
    r0 = rows[0]
    mx = fmt == "mxfp4"
    head = (f"== {shape} | {fmt.upper()} | {routing} | EP {ep}: {r0['local_experts']} local "
            f"experts from {r0['expert_start']} ==\n"
            f"{'T':>6s} {'rows':>6s} {'D':>4s} {'roof us':>8s} {'ours us':>9s} {'%roof':>5s} "
            f"{'Humming':>9s} {'%roof':>5s} {'bf16 us':>9s} {'vs H':>6s} {'vs bf16':>7s}"
            + (f" {'vs NVFP4':>8s}" if mx else "") + f" {'chained':>8s}  notes")
    lines = [head]
    for r in rows:
        notes = []
        if r.get("check_ok") is False:
            notes.append("CHECK FAILED")
        if r.get("humming_gemm"):
            notes.append(r["humming_gemm"])
        notes += [f"{k}: {v}" for k, v in r.get("errors", {}).items()]
        lines.append(
            f"{r['T']:6d} {num(r.get('local_rows'), '6d', 6)} "
            f"{num(r.get('touched_experts'), '4d', 4)} {num(r.get('roofline_us'), '8.1f', 8)} "
            f"{num(r.get('ours_us'))} {num(r.get('ours_pct_roofline'), '4.0f', 4)}% "
            f"{num(r.get('humming_us'))} {num(r.get('humming_pct_roofline'), '4.0f', 4)}% "
            f"{num(r.get('bf16_us'))} {num(r.get('speedup_vs_humming'), '5.2f', 5)}x "
            f"{num(r.get('speedup_vs_bf16'), '6.2f', 6)}x"
            + (f" {num(r.get('speedup_vs_ours_nvfp4'), '7.2f', 7)}x" if mx else "")
            + f" {num(r.get('ours_chained_us'), '8.1f', 8)}  {'; '.join(notes)}")
    return "\n".join(lines)
