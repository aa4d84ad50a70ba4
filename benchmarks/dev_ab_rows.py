"""A/B helper (diagnostics, needs a GPU): weight row sets per CTA of the streamed decode kernel
(``StreamConfig.row_groups`` 1, the choice, vs 2: each activation fragment feeds twice the MMAs,
half the activation loads per weight, half the CTAs) and the tile shapes that fit with it.

Cases: V4-Flash MoE GEMM 1 (gate/up + SwiGLU) and GEMM 2 (down + router weight) at block_m 8 in
the MoE's real conditions (routing, pair-order gather, ``tile_rows``) for each ``--tokens``, and
dense linears (7168, 18432) / (18432, 7168) at ``--ms``. Every variant runs once on NaN-poisoned
outputs first and must agree with the chosen config on every row the MoE reads: bitwise at the
same ``warps_k`` (the same MMAs per output, only the CTA tiling differs), within fp32 summation
noise otherwise; then each is timed as its own CUDA graph,
L2 flushed before every replay (``bench_moe.time_graph``), variants alternating for
``--rounds`` rounds; median µs.

Usage: ``python benchmarks/dev_ab_rows.py [--tokens 1 8 32 128] [--ms 1 8] [--reps 30]
[--rounds 3] [--out FILE.json]``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _ab  # noqa: E402

#: (row_groups, warps_k, steps, stages) tried next to the chosen config
GRP_VARIANTS = [(2, 4, 1, 2), (2, 4, 1, 3), (2, 2, 2, 2), (2, 4, 2, 2), (2, 2, 1, 4)]
LIN_VARIANTS = [(2, 4, 2, 3), (2, 4, 2, 4), (2, 4, 1, 4), (2, 4, 1, 6)]


def _variants(base, shapes):
    out = [base]
    for rg, wk, u, st in shapes:
        try:
            cfg = dataclasses.replace(base, row_groups=rg, warps_k=wk, steps=u, stages=st,
                                      ctas=0)
        except ValueError:
            continue
        if cfg.name not in {c.name for c in out}:
            out.append(cfg)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = _ab.parser(__doc__, tokens=[1, 8, 32, 128], reps=30)
    parser.add_argument("--ms", nargs="+", type=int, default=[1, 8])
    args = parser.parse_args(argv)
    setup = _ab.gpu_setup()
    if setup is None:
        return 2
    bench_moe, shape, experts, flush = setup
    from nvfp4_ops.kernels import linear_cuda as L

    cases, checks = [], []
    for t in args.tokens:
        hidden, ids, weights = bench_moe.moe_inputs(shape, t, 5 + t)
        mg = bench_moe.moe_gemms(shape, experts, hidden, ids, weights, 8, True)
        for g in (mg.gemm1, mg.gemm2):
            base = L.choose_config(g.n, g.k, 8, g.epilogue, False, True, mg.m_tiles, True)
            vs = [(cfg, g.launcher(cfg)) for cfg in _variants(base, GRP_VARIANTS)]
            cases.append((f"{g.name} T={t}", vs))
            checks.append((f"{g.name} T={t}", vs, g.out, mg.real))
            vs[0][1]()  # GEMM 2 reads the chosen GEMM 1's output
    for n, k in ((7168, 18432), (18432, 7168)):
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            wt = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
            ws = (torch.rand(n, k // 16, device="cuda") + 0.25).to(torch.float8_e4m3fn)
            wg = torch.full((n,), 0.01, device="cuda")
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            base = L.choose_config(n, k, 8, "none", False, False, 1)
            vs = []
            for cfg in _variants(base, LIN_VARIANTS):
                def fn(cfg=cfg, x=x, wt=wt, ws=ws, wg=wg, out=out, n=n):
                    L._launch(cfg, x, None, wt[None], ws[None], L.per_row_global_view(wg, n), out,
                              None, None, None)
                vs.append((cfg, fn))
            cases.append((f"linear {n}x{k} M={m}", vs))
            checks.append((f"linear {n}x{k} M={m}", vs, out,
                           torch.ones(m, dtype=torch.bool, device="cuda")))
    for label, vs, dst, real in checks:
        ref = None
        for cfg, fn in vs:
            dst.fill_(float("nan"))
            fn()
            got = dst[real].clone()
            if ref is None:
                ref = got
                continue
            # the same consumer warps take the same k steps (bitwise equal); another split of
            # K inside the CTA only reorders fp32 sums
            same = (torch.equal(got, ref) if cfg.warps_k == vs[0][0].warps_k else
                    bool(torch.isfinite(got).all())
                    and (got.float() - ref.float()).abs().max().item()
                    <= 2e-2 * ref.float().abs().max().item())
            if not same:
                print(f"{label}: {cfg.name} DIFFERS from {vs[0][0].name}")
                return 1
        print(f"{label}: {len(vs)} configs agree on the rows read (bitwise at the same "
              "warps_k)", flush=True)
    med = _ab.alternate_cases({label: {cfg.name: fn for cfg, fn in vs} for label, vs in cases},
                              args.rounds, args.reps, flush)
    print(f"{'case':24s} {'config':64s} {'us':>8s} {'x chosen':>8s}")
    for label, d in med.items():
        first = next(iter(d.values()))
        for name, us in d.items():
            print(f"{label:24s} {name[7:71]:64s} {us:8.1f} {first / us:8.3f}")
    if args.out:
        args.out.write_text(json.dumps(med, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
