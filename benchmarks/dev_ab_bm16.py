"""A/B helper (diagnostics, needs a GPU): MoE tiles of 16 tokens on the streamed decode kernel
(pair-order activations, ``tile_rows``, launch overlap) instead of the WGMMA kernel that
:func:`nvfp4_ops.kernels.linear_cuda._family` picks for them (V4-Flash T ~ 350-680: the mean
rows per expert is 9-16).

For each ``T``: the whole op (``moe_cuda.moe_forward``) with the chosen dispatch vs the same
data flow with both grouped GEMMs on streamed 16-token configs (the gather writes the pair order;
``--variants`` tile shapes for the streamed GEMMs besides ``choose_config``'s). Checked first
against ``moe_reference`` (rel L2 < 4e-3, both); timed as CUDA graphs, L2 flushed before every
replay, alternating rounds; median µs.

Usage: ``python benchmarks/dev_ab_bm16.py [--tokens 384 512 640] [--reps 20] [--rounds 3]
[--out FILE.json]``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _ab  # noqa: E402

#: (gate/up (warps_k, steps, stages), down (warps_k, steps, stages)) next to choose_config's
VARIANTS = [((4, 2, 2), (4, 2, 2)), ((2, 2, 2), (2, 2, 2)), ((4, 1, 3), (2, 2, 3))]


def main(argv: list[str] | None = None) -> int:
    args = _ab.parser(__doc__, tokens=[384, 512, 640], reps=20).parse_args(argv)
    setup = _ab.gpu_setup()
    if setup is None:
        return 2
    bench_moe, shape, experts, flush = setup
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels import moe_cuda
    from nvfp4_ops.kernels.cute import w4a16_stream as S
    from nvfp4_ops.reference import moe_reference
    from nvfp4_ops.testing import rel_l2

    def stream_gemm(shapes):
        def pick(n, k, block_m, epilogue, m_tiles, kperm, pdl):
            cfg = S.choose_config(n, k, 16, epilogue, False, True, 9, kperm=True, pdl=pdl)
            if shapes is not None:
                wk, u, st = shapes[0] if epilogue == "swiglu" else shapes[1]
                cfg = dataclasses.replace(cfg, warps_k=wk, steps=u, stages=st)
            return cfg
        return _ab.config_gemm(pick)

    lines = []
    for t in args.tokens:
        bm, kperm = moe_cuda.op_tile(t, shape.top_k, shape.experts, shape.hidden,
                                     shape.intermediate)
        hidden, ids, weights = bench_moe.moe_inputs(shape, t, 3 + t)
        want = moe_reference(hidden, ids, weights, *experts, 0, shape.swiglu_limit, 1.0)
        runs = {f"chosen bm{bm}": (L.grouped_w4a16_gemm, bm, kperm)}
        for shapes in [None] + VARIANTS:
            name = "stream bm16 " + ("choose_config" if shapes is None else str(shapes))
            runs[name] = (stream_gemm(shapes), 16, "pair")
        runs = {name: (lambda g=g, b=b, kp=kp, h=hidden, i=ids, w=weights: moe_cuda.moe_forward(
                    h, i, w, *experts, 0, shape.swiglu_limit, 1.0, gemm=g, block_m=b,
                    kperm=kp, pdl=True))
                for name, (g, b, kp) in runs.items()}
        for name, fn in runs.items():
            err = rel_l2(fn(), want)
            if not err < 4e-3:
                print(f"T={t} {name}: CHECK FAILED rel L2 {err:.2e}")
                return 1
        med, _ = _ab.alternate(runs, args.rounds, args.reps, flush)
        _ab.print_vs_first(f"T={t} (checked vs reference)", med, width=44)
        lines.append({"T": t, "us": med})
    if args.out:
        args.out.write_text(json.dumps(lines, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
