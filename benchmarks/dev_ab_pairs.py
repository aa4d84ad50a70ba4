"""A/B helper (diagnostics, needs a GPU): the MoE's 8-token (streamed) GEMM tiles with the
activations in the natural k order vs the ``pair`` order of ``nvfp4_ops/kernels/kperm.py``
(the B fragment straight from the loaded words, no ``prmt``), in one process.

For each ``T`` (default 1 8 32 128: V4-Flash decode, block_m 8) and each order, on the same
routing and weights: the whole op data flow (``moe_cuda.moe_forward`` with the real grouped
GEMM) and its stages (``bench_moe.moe_stages``: routing + gather, GEMM 1 (gate/up + SwiGLU),
GEMM 2 (down + router weight), combine), each its own CUDA graph, L2 flushed before every timed
replay (``bench_moe.time_graph``), median µs. The two orders alternate for ``--rounds`` rounds
(each time is the median over rounds of the per-round medians) so clock drift hits both. Before
timing, the two orders' whole-op outputs must be bitwise equal (same MMAs, only the activation
layout differs) and match ``moe_reference`` (relative L2 < 4e-3); the script stops otherwise.

Usage: ``python benchmarks/dev_ab_pairs.py [--shape v4-flash] [--tokens 1 8 32 128]
[--reps 30] [--rounds 3] [--out FILE.json]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _ab  # noqa: E402

LAYOUTS = ("natural", "pair")


def _stages(bench_moe, shape, experts, hidden, ids, weights, bm: int, kperm: bool) -> dict:
    """name -> zero-argument callable: the whole op, then its stages
    (``bench_moe.moe_stages``; buffers prepared once, outside capture)."""
    from nvfp4_ops.kernels import linear_cuda, moe_cuda

    return {
        "whole op": lambda: moe_cuda.moe_forward(
            hidden, ids, weights, *experts, 0, shape.swiglu_limit, 1.0,
            gemm=linear_cuda.grouped_w4a16_gemm, block_m=bm, kperm=kperm),
        **bench_moe.moe_stages(shape, experts, hidden, ids, weights, bm, kperm),
    }


def main(argv: list[str] | None = None) -> int:
    parser = _ab.parser(__doc__, tokens=[1, 8, 32, 128], reps=30)
    parser.add_argument("--shape", default="v4-flash")
    args = parser.parse_args(argv)
    setup = _ab.gpu_setup(args.shape)
    if setup is None:
        return 2
    bench_moe, shape, experts, flush = setup
    from nvfp4_ops.kernels import moe_cuda
    from nvfp4_ops.reference import moe_reference
    from nvfp4_ops.testing import rel_l2

    print(f"{shape.name}: {torch.cuda.get_device_name()}, reps {args.reps}, rounds "
          f"{args.rounds}", flush=True)
    lines = []
    for num_tokens in args.tokens:
        bm, kperm = moe_cuda.op_tile(num_tokens, shape.top_k, shape.experts, shape.hidden,
                                     shape.intermediate)
        if bm != 8 or not kperm:
            print(f"T={num_tokens}: block_m {bm} does not run the pair order; skipped")
            continue
        hidden, ids, weights = bench_moe.moe_inputs(shape, num_tokens, 7 + num_tokens)
        stages = {layout: _stages(bench_moe, shape, experts, hidden, ids, weights, bm,
                                   layout == "pair")
                  for layout in LAYOUTS}
        outs = {layout: stages[layout]["whole op"]() for layout in LAYOUTS}
        want = moe_reference(hidden, ids, weights, *experts, 0, shape.swiglu_limit, 1.0)
        err = rel_l2(outs["pair"], want)
        if not torch.equal(outs["natural"], outs["pair"]) or not err < 4e-3:
            print(f"T={num_tokens}: CHECK FAILED (bitwise equal: "
                  f"{torch.equal(outs['natural'], outs['pair'])}, rel L2 {err:.2e})")
            return 1
        flat, flat_rounds = _ab.alternate(
            {(layout, name): fn for layout in LAYOUTS for name, fn in stages[layout].items()},
            args.rounds, args.reps, flush)
        med: dict[str, dict[str, float]] = {layout: {} for layout in LAYOUTS}
        times: dict[str, dict[str, list[float]]] = {layout: {} for layout in LAYOUTS}
        for (layout, name), us in flat.items():
            med[layout][name] = us
            times[layout][name] = flat_rounds[(layout, name)]
        print(f"T={num_tokens} block_m={bm} (checked: bitwise equal, rel L2 {err:.2e})")
        print(f"  {'stage':16s} {'natural us':>11s} {'pair us':>9s} {'pair/nat':>8s}")
        for name in med["natural"]:
            nat, pair = med["natural"][name], med["pair"][name]
            print(f"  {name:16s} {nat:11.1f} {pair:9.1f} {pair / nat:8.3f}")
        line = {"shape": shape.name, "T": num_tokens, "block_m": bm, "rel_l2": err,
                "us": med, "rounds": times}
        print(json.dumps(line), flush=True)
        lines.append(line)
    if args.out:
        args.out.write_text(json.dumps(lines, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
