"""A/B of the eager calls' host-side mechanisms (CUDA only): the launches kept for repeated
calls (``ops._eager.Repeats``) and the CUDA graphs they replay (``kernels.eager_graphs``: the
MoE's GEMM graph, and whole calls keyed by their tensors' addresses).

V4-Flash (wperm weights) at each ``--tokens``: one eager ``nvfp4_ops.moe`` call timed with CUDA
events around the Python call (host and device time, as ``bench_overhead.py eager`` does) and
its host time alone, in four modes:

* ``graphs``: kept launch and graphs, the same input tensors every call (a steady loop: the
  whole call replays from one graph);
* ``graphs,rot``: the same, but the inputs rotate over 100 copies, so the addresses never
  repeat soon enough for a whole-call graph (the MoE's GEMMs still replay from theirs);
* ``kept``: kept launch, graphs off (``eager_graphs.ENABLED``);
* ``neither``: every call checked and prepared, no graphs;

then ``nvfp4_ops.linear`` M = 1 at (7168, 18432) on prepared (wfrag) weights in the same modes.
Modes alternate over ``--rounds`` rounds; the outputs must be bitwise equal.

    python benchmarks/dev/ab_eager_graph.py --tokens 1 4 16 --rounds 5
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_overhead import _events_median_us, _host_median_us, host_speed_us  # noqa: E402

#: mode -> (kept launches, graphs, rotate the inputs)
MODES = {"graphs": (True, True, False), "graphs,rot": (True, True, True),
         "kept": (True, False, False), "neither": (False, False, False)}
ROTATE = 100


def main(argv: list[str] | None = None) -> int:
    import nvfp4_ops
    from nvfp4_ops.kernels import eager_graphs
    from nvfp4_ops.ops._eager import Repeats
    from nvfp4_ops.testing import fast_random_experts, random_routing

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", nargs="+", type=int, default=[1, 4, 16])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args(argv)
    s = nvfp4_ops.get_shape("v4-flash")
    experts = fast_random_experts(s.experts, s.hidden, s.intermediate, device="cuda")
    nvfp4_ops.to_wperm_(experts.w13)
    nvfp4_ops.to_wperm_(experts.w2)
    print(f"host speed {host_speed_us():.2f} µs (bench_overhead.host_speed_us)")
    print(f"{'case':12s} " + " ".join(f"{m + ' ev':>14s} {m + ' host':>15s}" for m in MODES)
          + "  (µs, medians of round medians)")
    find, keep = Repeats.find, Repeats.keep

    def set_mode(kept: bool, graphs: bool) -> None:
        eager_graphs.ENABLED = graphs
        Repeats.find = find if kept else (lambda self, *a: None)
        Repeats.keep = keep if kept else (lambda self, *a: None)

    def ab(name, call, inputs):
        """``call(*inputs)`` per mode; rotating modes cycle over ``ROTATE`` copies of
        ``inputs`` (made once, outside the timing)."""
        copies = [tuple(t.clone() for t in inputs) for _ in range(ROTATE)]
        outs, eager, host = {}, {m: [] for m in MODES}, {m: [] for m in MODES}
        for _ in range(args.rounds):
            for m, (kept, graphs, rot) in MODES.items():
                set_mode(kept, graphs)
                if rot:
                    cycle = itertools.cycle(copies)

                    def fn(cycle=cycle):
                        return call(*next(cycle))
                else:
                    def fn():
                        return call(*inputs)
                for _ in range(5):
                    fn()
                eager[m].append(_events_median_us(fn, args.reps))
                host[m].append(_host_median_us(fn, args.reps))
                outs[m] = call(*inputs)
        set_mode(True, True)
        same = all(torch.equal(outs["neither"], o) for o in outs.values())
        cols = " ".join(f"{statistics.median(eager[m]):14.1f} {statistics.median(host[m]):15.1f}"
                        for m in MODES)
        print(f"{name:12s} {cols}  {'bitwise equal' if same else 'OUTPUTS DIFFER'}",
              flush=True)

    for num_tokens in args.tokens:
        x = torch.randn(num_tokens, s.hidden, device="cuda").to(torch.bfloat16)
        ids, weights = random_routing(num_tokens, s.experts, s.top_k, device="cuda")

        def moe(x, ids, weights):
            return nvfp4_ops.moe(x, ids, weights, *experts.args(),
                                 global_num_experts=s.experts, swiglu_limit=s.swiglu_limit,
                                 wperm=True)

        ab(f"moe T={num_tokens}", moe, (x, ids, weights))
    n, k = 7168, 18432
    w = nvfp4_ops.to_wfrag_(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8,
                                          device="cuda"))
    ws = torch.full((n, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(
        torch.float8_e4m3fn)
    wg = torch.ones((), device="cuda")
    xl = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    ab("linear M=1", lambda x: nvfp4_ops.linear(x, w, ws, wg, wfrag=True), (xl,))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
