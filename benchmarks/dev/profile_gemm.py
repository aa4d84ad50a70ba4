"""Launch one op a few times on fresh random data, for a profiler (Nsight Compute) to attach.

Needs a CUDA GPU. Three kinds of run:

* ``linear N K M``: ``nvfp4_ops.linear`` on prepared weights (``nvfp4_ops.to_wfrag_``, what
  the vLLM glue runs on CUDA; ``--checkpoint``: the checkpoint order), as dispatched;
* ``moe SHAPE T``: ``nvfp4_ops.moe`` for a named model shape (``v4-flash``, ``v4-pro``) with
  uniform top-k routing, the weights in the ``wperm`` bit order (``--checkpoint``: as stored);
* ``wgmma N K M BLOCK_M ROW_WGS STAGES STREAMK [FIELD=VALUE ...]``: one dense WGMMA tile that
  the dispatch need not pick (``WgmmaConfig`` fields as ints, e.g. ``scale_ahead=1``), on
  prepared weights, launched through ``linear_cuda.run_gemm`` with
  ``dispatch.plan_of_config``.

Each run launches the op four times; the GEMM kernels' names contain ``W4A16``, so for example
``ncu --kernel-name regex:W4A16 --launch-skip 2 --launch-count 1 --set full -o prof python
benchmarks/dev/profile_gemm.py linear 7168 18432 16`` profiles the third linear (the first
launches compile or load the kernel). A MoE call launches two GEMMs: skip 4, count 2.
``benchmarks/dev/ncu_stalls.sh`` and ``ncu_source.sh`` wrap the usual reports.
"""

from __future__ import annotations

import argparse

import torch

LAUNCHES = 4


def random_weights(groups: int, n: int, k: int, gen: torch.Generator):
    """Random codes, e4m3 block scales in [0.01, 3) and fp32 global scales in [0.5, 1.5)."""
    shape = (groups, n) if groups else (n,)
    w = torch.randint(0, 256, (*shape, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    s = (torch.rand(*shape, k // 16, device="cuda", generator=gen) * 3 + 0.01).to(
        torch.float8_e4m3fn)
    g = torch.rand(*shape, device="cuda", generator=gen) + 0.5
    return w, s, g


def run_linear(n: int, k: int, m: int, checkpoint: bool) -> None:
    import nvfp4_ops

    gen = torch.Generator(device="cuda").manual_seed(0)
    w, s, g = random_weights(0, n, k, gen)
    if not checkpoint:
        nvfp4_ops.to_wfrag_(w)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    for _ in range(LAUNCHES):
        nvfp4_ops.linear(x, w, s, g, wfrag=not checkpoint)
    torch.cuda.synchronize()


def run_moe(shape_name: str, num_tokens: int, checkpoint: bool) -> None:
    import nvfp4_ops
    from nvfp4_ops.testing import random_routing

    shape = nvfp4_ops.get_shape(shape_name)
    h, i, e = shape.hidden, shape.intermediate, shape.experts
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13, w13_s, _ = random_weights(e, 2 * i, h, gen)
    w13_g = torch.rand(e, 2, device="cuda", generator=gen) * 1e-3 + 1e-3
    w2, w2_s, _ = random_weights(e, h, i, gen)
    w2_g = torch.rand(e, device="cuda", generator=gen) * 1e-3 + 1e-3
    if not checkpoint:
        nvfp4_ops.to_wperm_(w13)
        nvfp4_ops.to_wperm_(w2)
    hidden = torch.randn(num_tokens, h, device="cuda", generator=gen).to(torch.bfloat16)
    ids, weights = random_routing(num_tokens, e, shape.top_k, device="cuda")
    for _ in range(LAUNCHES):
        nvfp4_ops.moe(hidden, ids, weights, w13, w13_s, w13_g, w2, w2_s, w2_g,
                      global_num_experts=e, swiglu_limit=shape.swiglu_limit,
                      wperm=not checkpoint)
    torch.cuda.synchronize()


def run_tile(n: int, k: int, m: int, block_m: int, row_wgs: int, stages: int,
             streamk: int, **extra: int) -> None:
    """A dense WGMMA tile (``none`` epilogue) on random wfrag + wperm weights; ``extra``: more
    :class:`~nvfp4_ops.kernels.cute.w4a16_wgmma.WgmmaConfig` fields."""
    from nvfp4_ops.kernels import linear_cuda
    from nvfp4_ops.kernels.cute.w4a16_wgmma import WgmmaConfig
    from nvfp4_ops.kernels.dispatch import plan_of_config
    from nvfp4_ops.orders import WeightOrder

    cfg = WgmmaConfig(n, k, "none", False, False, block_m, row_wgs, 1, stages,
                      order=WeightOrder.WFRAG, streamk=streamk, **extra)
    print(cfg.name, flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    w, s, g = random_weights(1, n, k, gen)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    plan = plan_of_config(cfg)
    for _ in range(LAUNCHES):
        linear_cuda.run_gemm(plan, a, w, s, g[0], out)
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="kind", required=True)
    lin = sub.add_parser("linear", help="nvfp4_ops.linear as dispatched")
    for name in ("n", "k", "m"):
        lin.add_argument(name, type=int)
    lin.add_argument("--checkpoint", action="store_true", help="checkpoint-order weights")
    moe = sub.add_parser("moe", help="nvfp4_ops.moe for a model shape")
    moe.add_argument("shape")
    moe.add_argument("tokens", type=int)
    moe.add_argument("--checkpoint", action="store_true", help="checkpoint-order weights")
    tile = sub.add_parser("wgmma", help="one dense WGMMA tile, dispatched or not")
    for name in ("n", "k", "m", "block_m", "row_wgs", "stages", "streamk"):
        tile.add_argument(name, type=int)
    tile.add_argument("fields", nargs="*", metavar="FIELD=VALUE",
                      help="more WgmmaConfig fields, as ints")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_gemm: needs a CUDA GPU")
    if args.kind == "linear":
        run_linear(args.n, args.k, args.m, args.checkpoint)
    elif args.kind == "moe":
        run_moe(args.shape, args.tokens, args.checkpoint)
    else:
        extra = {f: int(v) for f, v in (a.split("=", 1) for a in args.fields)}
        run_tile(args.n, args.k, args.m, args.block_m, args.row_wgs, args.stages, args.streamk,
                 **extra)


if __name__ == "__main__":
    main()
