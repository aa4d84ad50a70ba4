"""A/B helper (diagnostics, needs a GPU): the ``wperm`` weight bit order
(:mod:`nvfp4_ops.kernels.wperm`: 11 instead of 16 integer SASS instructions per decoded word,
the streamed kernel's main loop 437 -> 357 instructions per 16 MMAs, 62 -> 55 registers) vs the
checkpoint order, same configs otherwise.

Cases: the whole V4-Flash MoE op (``moe_cuda.moe_forward`` as the op runs it: launch overlap,
permuted activations; ``wperm=True`` vs False), its GEMM 1 (gate/up + SwiGLU) and GEMM 2 (down +
router weight) alone in the MoE's real conditions (routing, permuted-order gather,
``tile_rows``) at the MoE's tile for each ``--tokens`` (8-token streamed tiles up to T = 128,
WGMMA ``kperm`` tiles above), and dense streamed linears (7168, 18432) / (18432, 7168) at
``--ms``. The ``wperm`` variant reads a copy of the weights made by
:func:`nvfp4_ops.kernels.wperm.to_wperm` on the GPU. Each variant runs once on NaN-poisoned
outputs first and must be **bitwise** equal to the checkpoint-order run on every row the MoE
reads (the decoders give the same registers, so the same MMAs); then both are timed as CUDA
graphs, L2 flushed before every replay (``bench_moe.time_graph``), alternating for ``--rounds``
rounds; median µs.

Usage: ``python benchmarks/dev_ab_wperm.py [--tokens 1 8 128 512 4096] [--ms 1 8] [--reps 30]
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


def main(argv: list[str] | None = None) -> int:
    parser = _ab.parser(__doc__, tokens=[1, 8, 128, 512, 4096], reps=30)
    parser.add_argument("--ms", nargs="+", type=int, default=[1, 8])
    args = parser.parse_args(argv)
    setup = _ab.gpu_setup()
    if setup is None:
        return 2
    bench_moe, shape, experts, flush = setup
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels import moe_cuda as M
    from nvfp4_ops.kernels.wperm import to_wperm

    print("permuting the expert weights on the GPU ...", flush=True)
    w13, w13_s, w13_g, w2, w2_s, w2_g = experts
    w13_p, w2_p = to_wperm(w13), to_wperm(w2)
    cases = []  # (label, [(name, fn)], dst, rows mask)
    for t in args.tokens:
        bm, kperm = M.op_tile(t, shape.top_k, shape.experts, shape.hidden, shape.intermediate)
        hidden, ids, weights = bench_moe.moe_inputs(shape, t, 11 + t)
        mg = bench_moe.moe_gemms(shape, experts, hidden, ids, weights, bm, kperm)

        def whole(wp, h=hidden, ids=ids, w=weights, bm=bm, kperm=kperm):
            ex = (w13_p if wp else w13, w13_s, w13_g, w2_p if wp else w2, w2_s, w2_g)
            return M.moe_forward(h, ids, w, *ex, 0, shape.swiglu_limit, 1.0,
                                 gemm=L.grouped_w4a16_gemm, block_m=bm, kperm=kperm, pdl=True,
                                 wperm=wp)
        cases.append((f"whole op T={t} bm{bm}", [(f"op_bm{bm}", lambda f=whole: f(False)),
                                                  (f"op_bm{bm}_wp", lambda f=whole: f(True))],
                       None, None))
        for g, w_p in ((mg.gemm1, w13_p), (mg.gemm2, w2_p)):
            base = L.choose_config(g.n, g.k, bm, g.epilogue, False, True, mg.m_tiles, kperm)
            wp_cfg = dataclasses.replace(base, wperm=True)
            vs = [(base.name, g.launcher(base)), (wp_cfg.name, g.launcher(wp_cfg, w_p))]
            cases.append((f"{g.name} T={t} bm{bm}", vs, g.out, mg.real))
            vs[0][1]()  # GEMM 2 reads the checkpoint-order GEMM 1's output
    for n, k in ((7168, 18432), (18432, 7168)):
        wt = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        wt_p = to_wperm(wt)
        ws = (torch.rand(n, k // 16, device="cuda") + 0.25).to(torch.float8_e4m3fn)
        wg = torch.rand(n, device="cuda") * 0.02 + 0.005
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            base = L.choose_config(n, k, 8, "none", False, False, 1)
            vs = []
            for cfg, w_ in ((base, wt), (dataclasses.replace(base, wperm=True), wt_p)):
                def fn(cfg=cfg, x=x, w_=w_, ws=ws, wg=wg, out=out, n=n):
                    L._launch(cfg, x, None, w_[None], ws[None], L.per_row_global_view(wg, n),
                              out, None, None, None)
                vs.append((cfg.name, fn))
            cases.append((f"linear {n}x{k} M={m}", vs, out,
                          torch.ones(m, dtype=torch.bool, device="cuda")))
    for label, vs, dst, real in cases:
        got = []
        for _, fn in vs:
            if dst is None:  # the whole op returns its output
                got.append(fn())
                continue
            dst.fill_(float("nan"))
            fn()
            got.append(dst[real].clone())
        if not (bool(torch.isfinite(got[0]).all()) and torch.equal(got[0], got[1])):
            print(f"{label}: wperm output DIFFERS from the checkpoint order")
            return 1
        print(f"{label}: bitwise equal ({got[0].shape[0]} rows)", flush=True)
    med = _ab.alternate_cases({label: dict(vs) for label, vs, _, _ in cases}, args.rounds,
                              args.reps, flush)
    print(f"{'case':28s} {'checkpoint us':>14s} {'wperm us':>10s} {'wperm/ckpt':>10s}")
    for label, d in med.items():
        base_us, wp_us = d.values()
        print(f"{label:28s} {base_us:14.1f} {wp_us:10.1f} {wp_us / base_us:10.3f}")
    if args.out:
        args.out.write_text(json.dumps(med, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
