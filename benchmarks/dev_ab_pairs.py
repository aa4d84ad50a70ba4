"""A/B helper (diagnostics, needs a GPU): the MoE's 8-token (streamed) GEMM tiles with the
activations in the natural k order vs the ``pair`` order of ``nvfp4_ops/kernels/kperm.py``
(the B fragment straight from the loaded words, no ``prmt``), in one process.

For each ``T`` (default 1 8 32 128: V4-Flash decode, block_m 8) and each order, on the same
routing and weights: the whole op data flow (``moe_cuda.moe_forward`` with the real grouped
GEMM), routing + gather, GEMM 1 (gate/up + SwiGLU) and GEMM 2 (down + router weight), each its
own CUDA graph, L2 flushed before every timed replay (``bench_moe.time_graph``), median µs. The
two orders alternate for ``--rounds`` rounds (each time is the median over rounds of the
per-round medians) so clock drift hits both. Before timing, the two orders' whole-op outputs
must be bitwise equal (same MMAs, only the activation layout differs) and match
``moe_reference`` (relative L2 < 4e-3); the script stops otherwise.

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


def _stages(shape, experts, hidden, ids, weights, bm: int, kperm: bool) -> dict:
    """name -> zero-argument callable of one stage (buffers prepared once, outside capture)."""
    from nvfp4_ops.kernels import linear_cuda, moe_cuda
    from nvfp4_ops.kernels.triton import moe_routing

    w13, w13_scale, w13_global, w2, w2_scale, w2_global = experts
    gemm = linear_cuda.grouped_w4a16_gemm
    inter, hidden_size = shape.intermediate, shape.hidden
    kw = {"kperm": True} if kperm else {}
    routing = moe_routing.moe_routing(ids, shape.experts, 0, bm)
    a, row_scale = moe_routing.gather_rows(hidden, weights, routing, kperm)
    g13 = linear_cuda.gate_up_global_view(w13_global, inter)
    g2 = linear_cuda.per_group_global_view(w2_global, hidden_size)
    act = torch.empty(a.shape[0], inter, dtype=torch.bfloat16, device=hidden.device)
    y = torch.empty(a.shape[0], hidden_size, dtype=torch.bfloat16, device=hidden.device)
    return {
        "whole op": lambda: moe_cuda.moe_forward(
            hidden, ids, weights, *experts, 0, shape.swiglu_limit, 1.0, gemm=gemm,
            block_m=bm, kperm=kperm),
        "routing+gather": lambda: moe_routing.gather_rows(
            hidden, weights, moe_routing.moe_routing(ids, shape.experts, 0, bm), kperm),
        "gemm1 swiglu": lambda: gemm(a, routing.tile_expert, w13, w13_scale, g13, act,
                                     epilogue="swiglu", swiglu_limit=shape.swiglu_limit,
                                     row_scale=None, bias=None, block_m=bm,
                                     tile_rows=routing.tile_rows, **kw),
        "gemm2 row_scale": lambda: gemm(act, routing.tile_expert, w2, w2_scale, g2, y,
                                        epilogue="row_scale", swiglu_limit=None,
                                        row_scale=row_scale, bias=None, block_m=bm,
                                        tile_rows=routing.tile_rows, **kw),
    }


def main(argv: list[str] | None = None) -> int:
    parser = _ab.parser(__doc__, tokens=[1, 8, 32, 128], reps=30)
    parser.add_argument("--shape", default="v4-flash")
    args = parser.parse_args(argv)
    setup = _ab.gpu_setup(args.shape)
    if setup is None:
        return 2
    _, shape, experts, flush = setup
    from nvfp4_ops.kernels import linear_cuda, moe_cuda
    from nvfp4_ops.reference import moe_reference
    from nvfp4_ops.testing import random_routing, rel_l2

    print(f"{shape.name}: {torch.cuda.get_device_name()}, reps {args.reps}, rounds "
          f"{args.rounds}", flush=True)
    lines = []
    for num_tokens in args.tokens:
        bm = moe_cuda.choose_block_m(num_tokens * shape.top_k, shape.experts)
        if bm != 8 or not linear_cuda.grouped_kperm(shape.hidden, shape.intermediate, bm):
            print(f"T={num_tokens}: block_m {bm} does not run the pair order; skipped")
            continue
        torch.manual_seed(7 + num_tokens)
        hidden = torch.randn(num_tokens, shape.hidden, device="cuda").to(torch.bfloat16)
        ids, weights = random_routing(num_tokens, shape.experts, shape.top_k, device="cuda")
        stages = {layout: _stages(shape, experts, hidden, ids, weights, bm, layout == "pair")
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
