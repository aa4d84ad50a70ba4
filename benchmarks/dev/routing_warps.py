"""The MoE's one-CTA routing kernels alone at several warp counts (``moe_routing.FUSED_NUM_WARPS``).

At decode the routing is the first kernel of every ``nvfp4::moe`` call and the GEMMs wait for it
(4.4-5.2 µs on an H100: ``nvfp4_ops/kernels/DESIGN.md``, section 8, "In place"). Its scan
reduces over the experts; with more than one warp each reduction crosses warps through shared
memory and a CTA barrier. This launches the same kernel (same code, same arguments) at each
warp count, and with ``--direct`` also the direct kernel (``moe_routing.DIRECT_ROUTING``: one
pass over the slots, no atomics, no barrier) where the slots fit it (one token at
``--block-m 8``), checks that every variant gives the first one's routing
(``nvfp4_ops.testing.routing_mismatch``: the same up to the slots' order inside a segment),
then times it in a CUDA graph: one launch per replay, L2 flushed by a read before each
(latency, the graph launch included), and 20 chained launches per replay (throughput, per
launch). Rounds alternate the variants; each figure is the best round's median.

Needs a CUDA GPU::

    python benchmarks/dev/routing_warps.py --tokens 1 8 64 512 --warps 8 4 2 1
    python benchmarks/dev/routing_warps.py --tokens 1 --warps 8 4 --direct

For the whole op with the routing at ``N`` warps, in place: ``moe_timeline.py --routing-warps N``
(``--direct-routing`` for the direct kernel).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _timing import capture, l2_flush, replay_median_us  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 8, 64, 512])
    p.add_argument("--warps", nargs="+", type=int, default=[8, 4, 2, 1])
    p.add_argument("--experts", type=int, default=256, help="all routed experts")
    p.add_argument("--top-k", type=int, default=6)
    p.add_argument("--ep", nargs="+", type=int, default=[1, 8],
                   help="EP sizes: the rank in the middle of the experts")
    p.add_argument("--block-m", type=int, default=8)
    p.add_argument("--direct", action="store_true",
                   help="also the direct kernel where the slots fit it")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("routing_warps.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from nvfp4_ops.kernels.triton import moe_routing as mr
    from nvfp4_ops.kernels.triton._launch import Launch
    from nvfp4_ops.testing import ep_slice, make_routing, routing_mismatch

    print(f"# {' '.join(sys.argv)}\n# {torch.cuda.get_device_name()}, the one-CTA kernel up to "
          f"{mr.FUSED_MAX_SLOTS} slots")
    flush = l2_flush("read")
    rows = []
    for t in args.tokens:
        if t * args.top_k > mr.FUSED_MAX_SLOTS:
            print(f"T={t}: {t * args.top_k} slots run the four-launch routing; skipped")
            continue
        ids, _ = make_routing("uniform", t, args.experts, args.top_k, seed=t)
        ids = ids.cuda()
        kernels = ["one-CTA"]
        if args.direct and mr.direct_routing_fits(ids.numel(), args.block_m, None):
            kernels.append("direct")
        variants = [(kernel, warps) for kernel in kernels for warps in args.warps]
        for ep in args.ep:
            start, local = ep_slice(args.experts, ep)
            want, times = None, {}
            for _ in range(args.rounds):
                for kernel, warps in variants:
                    bufs = mr.routing_buffers(ids.device, ids.numel(), local, args.block_m)
                    mr.DIRECT_ROUTING = kernel == "direct"
                    result, launch = mr.routing_launch(ids, local, start, args.block_m,
                                                       buffers=bufs)
                    run = Launch(launch.launcher, launch.grid, launch.args, {"num_warps": warps})
                    run()
                    torch.cuda.synchronize()
                    got = type(result)(*[x.clone() if isinstance(x, torch.Tensor) else x
                                         for x in result])
                    if want is None:
                        want = got
                    elif (diff := routing_mismatch(got, want, ids, start)) is not None:
                        print(f"T={t} EP {ep}, {kernel} at {warps} warps: {diff} differs "
                              f"from {variants[0][0]} at {variants[0][1]} warps",
                              file=sys.stderr)
                        return 1
                    one, chained = capture([run]), capture([run] * 20)
                    times.setdefault((kernel, warps), []).append(
                        (replay_median_us(one, args.reps, before_each=flush),
                         replay_median_us(chained, args.reps, calls_per_replay=20)))
            for kernel, warps in variants:
                v = times[kernel, warps]
                rows.append((t, ep, local, kernel, warps, min(x[0] for x in v),
                             min(x[1] for x in v)))
    print(f"{'T':>5s} {'EP':>3s} {'E local':>7s} {'kernel':>7s} {'warps':>5s} "
          f"{'one launch per replay µs':>25s} {'chained µs per launch':>22s}  "
          "(chained: throughput, not latency)")
    for t, ep, local, kernel, warps, one, chained in rows:
        print(f"{t:5d} {ep:3d} {local:7d} {kernel:>7s} {warps:5d} {one:25.2f} {chained:22.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
