"""A/B helper (diagnostics, needs a GPU): tile shapes of the MoE's decode down GEMM (GEMM 2,
8-token streamed tiles) measured inside the whole op, launch overlap on (the op's setting), so a
config that overlaps GEMM 1 better counts.

For each ``T``: ``moe_cuda.moe_forward`` as the op runs it, then with GEMM 2 on each variant of
:data:`VARIANTS` (``StreamConfig`` fields replaced on ``choose_config``'s; GEMM 1 unchanged).
Every variant's output is checked against the chosen one first (bitwise when ``warps_k`` is the
same, else rel L2 < 1e-3), then the whole op is timed as a CUDA graph, L2 flushed before every
replay, variants alternating for ``--rounds`` rounds; median µs.

Usage: ``python benchmarks/dev_ab_down.py [--tokens 1 8] [--reps 30] [--rounds 3]
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

#: StreamConfig fields for GEMM 2 (``ctas`` = persistent CTAs)
VARIANTS = [dict(warps_k=4, steps=2, stages=2, ctas=792), dict(warps_k=4, steps=2, stages=3,
                                                                ctas=528),
            dict(warps_k=2, steps=2, stages=2, ctas=792), dict(warps_k=2, steps=2, stages=2,
                                                               rows8=True),
            dict(warps_k=4, steps=2, stages=2), dict(warps_k=2, steps=1, stages=4),
            dict(warps_k=4, steps=1, stages=3)]


def main(argv: list[str] | None = None) -> int:
    args = _ab.parser(__doc__, tokens=[1, 8], reps=30).parse_args(argv)
    setup = _ab.gpu_setup()
    if setup is None:
        return 2
    bench_moe, shape, experts, flush = setup
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels import moe_cuda
    from nvfp4_ops.testing import rel_l2

    def gemm_with(down):
        def pick(n, k, block_m, epilogue, m_tiles, kperm, pdl):
            if epilogue != "row_scale" or down is None:
                return None  # the op's own choice
            cfg = L.choose_config(n, k, block_m, epilogue, False, True, m_tiles, kperm, pdl)
            return dataclasses.replace(cfg, **down)
        return _ab.config_gemm(pick)

    lines = []
    for t in args.tokens:
        bm, kperm = moe_cuda.op_tile(t, shape.top_k, shape.experts, shape.hidden,
                                     shape.intermediate)
        hidden, ids, weights = bench_moe.moe_inputs(shape, t, 9 + t)
        def whole(g, b=bm, kp=kperm, h=hidden, i=ids, w=weights):
            return lambda: moe_cuda.moe_forward(h, i, w, *experts, 0, shape.swiglu_limit, 1.0,
                                                gemm=g, block_m=b, kperm=kp, pdl=True)

        runs, exact = {}, {}
        for down in [None] + VARIANTS:
            name = "chosen" if down is None else ",".join(f"{k}={v}" for k, v in down.items())
            runs[name] = whole(gemm_with(down))
            # the same consumer warps take the same k steps: bitwise equal
            exact[name] = down is None or (down.get("warps_k") == 2 and not down.get("rows8"))
        ref = runs["chosen"]()
        for name, fn in runs.items():
            got = fn()
            same_split = exact[name]
            ok = torch.equal(got, ref) if same_split else rel_l2(got, ref) < 1e-3
            if not ok:
                print(f"T={t} {name}: DIFFERS from the chosen config")
                return 1
        med, _ = _ab.alternate(runs, args.rounds, args.reps, flush)
        _ab.print_vs_first(f"T={t} block_m={bm} (checked against the chosen GEMM 2)", med)
        lines.append({"T": t, "us": med})
    if args.out:
        args.out.write_text(json.dumps(lines, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
