"""Diagnostic (needs a GPU): time a stream-K WGMMA tile against its grid size.

Why: at (18432, 7168), M = 128 the three-row-warpgroup tile takes as long with stream-K on all
132 SMs as without it on 96 (benchmarks/results/h200_2026-12-01_s9/). This launches the same
binary with ``G`` CTAs for each ``--grids`` value (the kernel reads ``G`` off the scratch's
length), so time against ``G`` says whether the SMs' count matters at all: with ``G`` = the
number of tiles every CTA runs exactly one whole tile through the stream-K code path.

Checks every grid's output against the one-CTA-per-tile kernel (fp32-order noise) before
timing. Timing: CUDA-graph replay, L2 evicted by reading a 256 MiB buffer before each replay,
grids alternating for ``--rounds`` rounds; median µs.

Usage: ``python benchmarks/dev_streamk_grid.py --nk 18432x7168 --m 128 --tile 128 3 6
--grids 48 66 96 120 132 [--rounds 3] [--reps 20]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nk", default="18432x7168")
    p.add_argument("--m", type=int, default=128)
    p.add_argument("--tile", nargs=3, type=int, default=[128, 3, 6],
                   help="block_m row_wgs stages")
    p.add_argument("--grids", nargs="+", type=int, default=[66, 96, 132])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import bench_moe

    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels.cute.w4a16_wgmma import WgmmaConfig

    n, k = (int(v) for v in args.nk.split("x"))
    m = args.m
    bm, r, st = args.tile
    base = WgmmaConfig(n, k, "none", False, False, bm, r, 1, st, wfrag=True, wperm=True)
    cfg = WgmmaConfig(n, k, "none", False, False, bm, r, 1, st, wfrag=True, wperm=True,
                      streamk=1)
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randint(0, 256, (1, n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    ws = (torch.rand(1, n, k // 16, device="cuda", generator=gen) * 3 + 0.01).to(
        torch.float8_e4m3fn).view(torch.uint8)
    gv = L.per_row_global_view(torch.rand(n, device="cuda", generator=gen) + 0.5, n)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    dummy_f = L._dummy(torch.float32, x.device)
    dummy_b = L._dummy(torch.bfloat16, x.device)
    items, units = cfg.streamk_units(m)
    print(f"{cfg.name}: {items} tiles, {units} units", flush=True)
    fn = L.compiled_gemm(cfg)
    ref = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    L._launch(base, x, None, w, ws, gv, ref, None, None, None)
    runs = {"one CTA per tile": lambda: L._launch(base, x, None, w, ws, gv, ref, None, None,
                                                   None)}
    for g in args.grids:
        counters = torch.zeros(items, dtype=torch.int32, device="cuda")
        scratch = torch.empty(g * 2 * cfg.partial_len, dtype=torch.int32, device="cuda")
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")

        def run(counters=counters, scratch=scratch, out=out):
            fn(x, w, ws, gv, out, counters, scratch, dummy_f, dummy_b, float("inf"))
        run()
        diff = (out.float() - ref.float()).abs().max().item()
        if not torch.isfinite(out.float()).all() or diff > 1e-2 * ref.float().abs().max():
            print(f"G={g}: WRONG (max abs diff {diff:.3e})")
            return 1
        runs[f"stream-K G={g}"] = run
    flush = bench_moe.l2_flush(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"),
                               "read")
    times: dict[str, list[float]] = {key: [] for key in runs}
    for _ in range(args.rounds):
        for key, f in runs.items():
            times[key].append(bench_moe.time_graph(f, args.reps, 2, flush))
    first = None
    for key, v in times.items():
        us = statistics.median(v)
        first = first or us
        print(f"  {key:24s} {us:8.1f} us  {first / us:6.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
