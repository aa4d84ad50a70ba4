"""Where one ``nvfp4::moe`` call's time goes, in place: every kernel's start and end inside a
CUDA-graph replay (the op's own chain, launch overlap included), L2 flushed by a read before
each replay, as ``bench_moe`` times the op.

``bench_moe.py --stages`` times each stage alone in its own graph (its own launch and ramp, no
overlap with its neighbours); this reads the kernels of the whole call from the profiler
(CUPTI's kernel records carry device timestamps for kernels a graph launches) and prints, per
kernel in start order, the median over the replays of its start and end relative to the
call's first kernel, its duration, and the gap to the end of the kernel before it (negative:
the two overlap, i.e. launch overlap let it start early). The last line per cell compares the
span from the first kernel's start to the last one's end with the replay's CUDA-event time
(the difference is the graph launch and the events themselves).

Needs a CUDA GPU::

    python benchmarks/dev/moe_timeline.py --shapes v4-flash v4-pro --tokens 1 8 32 --ep 1 8

Weights: random NVFP4 experts of the rank's slice only (``fast_random_experts``), codes in the
``wperm`` order, as ``bench_moe`` builds them; routing: ``bench_moe``'s for the cell
(``nvfp4_ops.testing.cell_routing``) over all experts.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _timing import git_commit, l2_flush, replay_median_us, warm_capture  # noqa: E402

#: kernel-name fragments -> the stage they belong to (the first match wins)
STAGES = (("W4A16", "gemm"), ("w4a16", "gemm"), ("_fused_routing", "routing"),
          ("_direct_routing", "routing"), ("_count_kernel", "routing"),
          ("_scan_kernel", "routing"), ("_place_kernel", "routing"),
          ("_gather_kernel", "gather"), ("_combine_kernel", "combine"))


def stage_of(name: str) -> str:
    """The op stage a kernel name belongs to (``?`` for a kernel not known here)."""
    for fragment, stage in STAGES:
        if fragment in name:
            return stage
    return "?"


def kernel_events(prof) -> list[tuple[str, float, float]]:
    """``(name, start_us, end_us)`` of every CUDA kernel the profiler recorded, by start."""
    out = []
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.time_range.elapsed_us() >= 0:
            out.append((ev.name, float(ev.time_range.start), float(ev.time_range.end)))
    return sorted(out, key=lambda e: e[1])


def split_replays(events, is_flush) -> list[list[tuple[str, float, float]]]:
    """The op's kernels of each replay: the kernels between two flush kernels (a memset
    right before a flush kernel is the flush's: torch's multi-block reduction clears its
    semaphores first)."""
    calls, cur = [], None
    for i, ev in enumerate(events):
        if is_flush(ev[0]):
            if cur:
                calls.append(cur)
            cur = []
        elif ev[0].startswith("Memset") and i + 1 < len(events) and is_flush(events[i + 1][0]):
            continue
        elif cur is not None:
            cur.append(ev)
    if cur:
        calls.append(cur)
    return calls


def summarize(calls) -> list[tuple[str, float, float, float, float]]:
    """Per kernel position (the calls must launch the same kernels): ``(label, start, end,
    duration, gap)`` medians in µs, times relative to the call's first kernel."""
    n = len(calls[0])
    same = [c for c in calls if len(c) == n and [e[0] for e in c] == [e[0] for e in calls[0]]]
    rows = []
    for j in range(n):
        t0s = [c[0][1] for c in same]
        start = statistics.median(c[j][1] - t0 for c, t0 in zip(same, t0s, strict=True))
        end = statistics.median(c[j][2] - t0 for c, t0 in zip(same, t0s, strict=True))
        dur = statistics.median(c[j][2] - c[j][1] for c in same)
        gap = (statistics.median(c[j][1] - c[j - 1][2] for c in same) if j else 0.0)
        name = calls[0][j][0]
        label = f"{stage_of(name)}:{name[:60]}"
        rows.append((label, start, end, dur, gap))
    return rows


def run_cell(shape, ep: int, num_tokens: int, routing: str, reps: int, flush, seed: int) -> None:
    import nvfp4_ops
    from nvfp4_ops.testing import cell_routing, ep_slice, fast_random_experts

    start, local = ep_slice(shape.experts, ep)
    q = fast_random_experts(local, shape.hidden, shape.intermediate, device="cuda", seed=seed,
                            first_expert=start, shared_gate_up_global=True)
    nvfp4_ops.to_wperm_(q.w13)
    nvfp4_ops.to_wperm_(q.w2)
    ids, weights = cell_routing(routing, num_tokens, shape.experts, shape.top_k, seed=seed)
    ids, weights = ids.cuda(), weights.cuda()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(num_tokens, shape.hidden, device="cuda", generator=gen).to(
        torch.bfloat16)

    def call():
        return nvfp4_ops.moe(hidden, ids, weights, q.w13, q.w13_scale, q.w13_global, q.w2,
                             q.w2_scale, q.w2_global, expert_start=start,
                             global_num_experts=shape.experts, swiglu_limit=shape.swiglu_limit,
                             output_scale=1.0, wperm=True)

    graph = warm_capture(call, warmup=3)
    event_us = replay_median_us(graph, reps, before_each=flush)

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            graph.replay()
        torch.cuda.synchronize()
    events = kernel_events(prof)
    calls = split_replays(events, lambda name: stage_of(name) == "?" and (
        "reduce" in name.lower() or "amax" in name.lower()))
    title = f"{shape.name} ep{ep} T={num_tokens} {routing}"
    if not calls or not calls[0]:
        names = sorted({e[0][:50] for e in events})[:12]
        print(f"{title}: no op kernels in the profile ({len(events)} kernel records: "
              f"{names}); replay {event_us:.1f} us")
        return
    rows = summarize(calls)
    print(f"{title}: {len(calls)} replays profiled; kernels in start order (median µs from "
          f"the first kernel's start)")
    print(f"  {'kernel':64s} {'start':>7s} {'end':>7s} {'dur':>7s} {'gap':>7s}")
    for label, s, e, d, g in rows:
        print(f"  {label:64s} {s:7.1f} {e:7.1f} {d:7.1f} {g:7.1f}")
    span = statistics.median(c[-1][2] - c[0][1] for c in calls if c)
    print(f"  span first start -> last end {span:.1f} us; replay (CUDA events) {event_us:.1f} us")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=["v4-flash"])
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 8, 32])
    p.add_argument("--ep", nargs="+", type=int, default=[1])
    p.add_argument("--routing", nargs="+", default=["uniform"], choices=("uniform", "skew"))
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--routing-warps", type=int, default=0,
                   help="run the one-CTA routing kernel at this many warps instead of "
                        "moe_routing.FUSED_NUM_WARPS (an A/B: one process per value)")
    p.add_argument("--direct-routing", action="store_true",
                   help="route calls whose slots fit it through the direct kernel "
                        "(moe_routing.DIRECT_ROUTING; an A/B: one process each way)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("moe_timeline.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import nvfp4_ops
    from nvfp4_ops.kernels.triton import moe_routing

    if args.routing_warps:
        moe_routing.FUSED_NUM_WARPS = args.routing_warps
    if args.direct_routing:
        moe_routing.DIRECT_ROUTING = True

    print(f"# {' '.join(sys.argv)}\n# tree {git_commit()}, {torch.cuda.get_device_name()}")
    flush = l2_flush("read")
    for name in args.shapes:
        shape = nvfp4_ops.get_shape(name)
        for ep in args.ep:
            for routing in args.routing:
                for t in args.tokens:
                    run_cell(shape, ep, t, routing, args.reps, flush, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
