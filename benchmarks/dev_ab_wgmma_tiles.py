"""A/B helper (diagnostics, needs a GPU): tile shapes of the MoE's grouped WGMMA GEMMs at
block_m 16 (V4-Flash T ~ 350-680 tokens), in the MoE's real conditions (routing, k-permuted
gather, GEMM 2 reading GEMM 1's output).

Variants (``WgmmaConfig`` fields replaced on ``choose_config``'s): row warpgroups per CTA
(``row_wgs`` 1: twice the CTAs, each activation tile feeds one warpgroup) and the TMA ring
depth (``stages``: fewer = less shared memory per CTA). Each variant runs once on NaN-poisoned
outputs first and must agree with the chosen config on every row of a real tile (rel L2 <
1e-3; the per-row MMAs are the same, so expect bitwise equality); then each GEMM is timed as its
own CUDA graph, L2 flushed before every replay, variants alternating for ``--rounds`` rounds.

Usage: ``python benchmarks/dev_ab_wgmma_tiles.py [--tokens 512] [--reps 20] [--rounds 3]
[--out FILE.json]``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _ab  # noqa: E402

#: run 1 (benchmarks/results/h200_2026-12-01_s5/wgmma_tiles/run1.log): row_wgs=1 + stages=4
#: was 10 % faster for GEMM 1 at T = 512; run 2 sweeps around it
VARIANTS = [dict(row_wgs=1), dict(row_wgs=1, stages=2), dict(row_wgs=1, stages=3),
            dict(row_wgs=1, stages=4), dict(row_wgs=1, stages=5), dict(stages=3),
            dict(stages=4)]


def main(argv: list[str] | None = None) -> int:
    args = _ab.parser(__doc__, tokens=[512], reps=20).parse_args(argv)
    setup = _ab.gpu_setup()
    if setup is None:
        return 2
    bench_moe, shape, (w13, w13_s, w13_g, w2, w2_s, w2_g), flush = setup
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels import moe_cuda
    from nvfp4_ops.kernels.triton import moe_routing as R
    from nvfp4_ops.testing import rel_l2

    g13 = L.gate_up_global_view(w13_g, shape.intermediate)
    g2 = L.per_group_global_view(w2_g, shape.hidden)
    h, i = shape.hidden, shape.intermediate
    results = []
    for t in args.tokens:
        bm, _ = moe_cuda.op_tile(t, shape.top_k, shape.experts, h, i)
        hidden, ids, weights = bench_moe.moe_inputs(shape, t, 13 + t)
        rt = R.moe_routing(ids, shape.experts, 0, bm)
        a, row_scale = R.gather_rows(hidden, weights, rt, True)
        p = a.shape[0]
        real = torch.repeat_interleave(rt.tile_expert >= 0, bm)[:p]
        act = torch.empty(p, i, dtype=torch.bfloat16, device="cuda")
        y = torch.empty(p, h, dtype=torch.bfloat16, device="cuda")
        for label, n, k, epi, src, dst, wt, ws, wg, rs in (
                (f"gemm1 T={t} bm{bm}", 2 * i, h, "swiglu", a, act, w13, w13_s, g13, None),
                (f"gemm2 T={t} bm{bm}", h, i, "row_scale", act, y, w2, w2_s, g2, row_scale)):
            base = L.choose_config(n, k, bm, epi, False, True, None, True)
            cfgs = [base]
            for v in VARIANTS:
                try:
                    c = dataclasses.replace(base, **v)
                except ValueError as err:
                    print(f"{label}: {v} refused ({err})")
                    continue
                if c.name not in {x.name for x in cfgs}:
                    cfgs.append(c)
            fns = []
            for cfg in cfgs:
                def fn(cfg=cfg, src=src, dst=dst, wt=wt, ws=ws, wg=wg, rs=rs, epi=epi, rt=rt):
                    L._launch(cfg, src, rt.tile_expert, wt, ws, wg, dst,
                              shape.swiglu_limit if epi == "swiglu" else None, rs, None,
                              rt.tile_rows)
                fns.append((cfg, fn))
            ref = None
            for cfg, fn in fns:
                dst.fill_(float("nan"))
                fn()
                got = dst[real].clone()
                if ref is None:
                    ref = got
                elif not (torch.isfinite(got).all() and rel_l2(got, ref) < 1e-3):
                    print(f"{label}: {cfg.name} DIFFERS from {cfgs[0].name}")
                    return 1
            fns[0][1]()  # GEMM 2 reads the chosen GEMM 1's output
            med, _ = _ab.alternate({cfg.name: fn for cfg, fn in fns}, args.rounds, args.reps,
                                   flush)
            first = med[cfgs[0].name]
            print(f"{label} (checked; first = chosen)", flush=True)
            for name, us in med.items():
                print(f"  {name:64s} {us:8.1f} us {first / us:6.3f}x", flush=True)
            results.append({"case": label, "us": med})
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
