"""Plot ``bench_moe.py`` results: µs per call vs tokens, ours vs the bf16 grouped baseline.

Usage: ``python benchmarks/plot_moe.py RESULTS.json [--out benchmarks/results/moe.png]``
(needs matplotlib, which is not a dependency of the package: ``pip install matplotlib``).
One line pair per shape in the JSON, log-log axes, the HBM roofline of the NVFP4 weights
(touched experts x 3 H I x 0.5625 bytes / 4.1 TB/s, as recorded per row) dashed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(args.results.read_text())
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for shape in sorted({r["shape"] for r in rows}):
        sel = sorted((r for r in rows if r["shape"] == shape), key=lambda r: r["T"])
        tokens = [r["T"] for r in sel]
        ax.plot(tokens, [r["ours_us"] for r in sel], "o-", label=f"nvfp4-ops {shape}")
        if all(r.get("bf16_us") for r in sel):
            ax.plot(tokens, [r["bf16_us"] for r in sel], "s--", label=f"bf16 _grouped_mm {shape}")
        ax.plot(tokens, [r["roofline_us"] for r in sel], ":", color="gray",
                label=f"roofline {shape}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens T (top-k routing, uniform random)")
    ax.set_ylabel("µs per MoE call (CUDA-graph replay, median)")
    ax.set_title(f"Fused MoE on {data.get('gpu', 'GPU')}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = args.out or args.results.with_suffix(".png")
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
