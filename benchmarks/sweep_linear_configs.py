"""Sweep W4A16 GEMM tile configs at decode sizes.

Default grid: row groups per warp x K-split warps (first version). ``--ring``: row groups x
weight-ring depth (``stages``) x decoder (``shift`` / ``lut``) with K split over 8 warps.

For each (N, K), M and config: check against the fp32 reference, then time CUDA-graph replays
over rotating weight sets (as ``bench_linear.py``). Prints a table and writes JSON; used to
pick :func:`nvfp4_ops.kernels.cute.w4a16_gemm.choose_config`'s decode choice.
Usage: ``python benchmarks/sweep_linear_configs.py [--ring] [--out FILE]`` (needs a GPU).
"""

from __future__ import annotations

import argparse
import json
import os

import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

from bench_linear import time_graph  # noqa: E402

from nvfp4_ops.kernels import linear_cuda  # noqa: E402
from nvfp4_ops.kernels.cute.w4a16_gemm import GemmConfig  # noqa: E402
from nvfp4_ops.reference import linear_fp32  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/linear_sweep_h200.json")
    p.add_argument("--ring", action="store_true", help="sweep ring depth and decoder")
    args = p.parse_args()
    if args.ring:
        grid = [dict(warps_k=8, row_groups=rg, stages=st, decode=dec)
                for rg, st, dec in [(2, 2, "lut"), (2, 2, "shift"), (2, 3, "shift"),
                                    (2, 4, "shift"), (1, 4, "shift"), (1, 6, "shift")]]
    else:
        grid = [dict(warps_k=wk, row_groups=rg) for rg in (1, 2, 4) for wk in (2, 4, 8, 16)]
    rows = []
    for n, k in [(7168, 18432), (18432, 7168)]:
        gen = torch.Generator(device="cuda").manual_seed(1)
        sets = 4
        ws = []
        for _ in range(sets):
            w = torch.randint(0, 256, (1, n, k // 2), dtype=torch.uint8, device="cuda",
                              generator=gen)
            s = (torch.rand(1, n, k // 16, device="cuda", generator=gen) + 0.5).to(
                torch.float8_e4m3fn).view(torch.uint8)
            ws.append((w, s, torch.rand(1, n, device="cuda", generator=gen) * 0.01 + 1e-3))
        for m in (1, 16):
            bm = 8 if m == 1 else 16
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            te = torch.zeros(1, dtype=torch.int32, device="cuda")
            rs = torch.zeros(1, dtype=torch.float32, device="cuda")
            bias = torch.zeros(1, dtype=torch.bfloat16, device="cuda")
            ref = linear_fp32(x, ws[0][0][0], ws[0][1][0].view(torch.float8_e4m3fn), ws[0][2][0])
            for opts in grid:
                rg, wk = opts["row_groups"], opts["warps_k"]
                try:
                    cfg = GemmConfig(n, k, "none", False, False, bm, 1, **opts)
                except ValueError:
                    continue
                fn = linear_cuda.compiled_gemm(cfg)

                def make(i, fn=fn, x=x, out=out, te=te, rs=rs, bias=bias, ws=ws):
                    w, s, g = ws[i]
                    # the binary takes w_global [G, H2, N/H2] (H2 = 1 here): a view
                    return lambda: fn(x, w, s, g.unsqueeze(1), out, te, te, rs, bias, 0.0)

                make(0)()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                us = time_graph(make, sets, 20, 20)
                tbs = 0.5625 * n * k / us / 1e6
                rows.append(dict(n=n, k=k, m=m, bm=bm, rg=rg, wk=wk, stages=cfg.stages,
                                 decode=cfg.decode, us=round(us, 2), tbs=round(tbs, 3),
                                 err=err))
                print(f"N={n:5d} K={k:5d} M={m:2d} rg={rg} wk={wk:2d} st={cfg.stages} "
                      f"{cfg.decode:5s}: {us:7.2f} us "
                      f"{tbs:5.2f} TB/s err {err:.2e}", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
