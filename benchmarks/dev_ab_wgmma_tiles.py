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
    bench_moe, shape, experts, flush = setup
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels import moe_cuda
    from nvfp4_ops.testing import rel_l2

    results = []
    for t in args.tokens:
        bm, _ = moe_cuda.op_tile(t, shape.top_k, shape.experts, shape.hidden,
                                 shape.intermediate)
        hidden, ids, weights = bench_moe.moe_inputs(shape, t, 13 + t)
        mg = bench_moe.moe_gemms(shape, experts, hidden, ids, weights, bm, True)
        for g in (mg.gemm1, mg.gemm2):
            label = f"{g.name} T={t} bm{bm}"
            base = L.choose_config(g.n, g.k, bm, g.epilogue, False, True, None, True)
            cfgs = [base]
            for v in VARIANTS:
                try:
                    c = dataclasses.replace(base, **v)
                except ValueError as err:
                    print(f"{label}: {v} refused ({err})")
                    continue
                if c.name not in {x.name for x in cfgs}:
                    cfgs.append(c)
            fns = [(cfg, g.launcher(cfg)) for cfg in cfgs]
            ref = None
            for cfg, fn in fns:
                g.out.fill_(float("nan"))
                fn()
                got = g.out[mg.real].clone()
                if ref is None:
                    ref = got
                elif not (torch.isfinite(got).all() and rel_l2(got, ref) < 1e-3):
                    print(f"{label}: {cfg.name} DIFFERS from {cfgs[0].name}")
                    return 1
            fns[0][1]()  # GEMM 2 reads the chosen GEMM 1's output
            med, _ = _ab.alternate({cfg.name: fn for cfg, fn in fns}, args.rounds, args.reps,
                                   flush)
            _ab.print_vs_first(f"{label} (checked; first = chosen)", med, width=64)
            results.append({"case": label, "us": med})
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
