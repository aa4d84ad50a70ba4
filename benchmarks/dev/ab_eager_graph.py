"""A/B of the eager calls' host-side mechanisms (CUDA only): the MoE's GEMM graphs
(``moe_cuda.EAGER_GRAPHS``) and the launches kept for repeated calls (``ops._eager.Repeats``).

V4-Flash (wperm weights) at each ``--tokens``: one eager ``nvfp4_ops.moe`` call timed with CUDA
events around the Python call (host and device time, as ``bench_overhead.py eager`` does) and
its host time alone, in three modes: kept launch + GEMM graph, kept launch with the GEMMs
launched one by one, and neither (every call checked and prepared); then ``nvfp4_ops.linear``
M = 1 at (7168, 18432) on prepared weights with and without its kept launch. Modes alternate
over ``--rounds`` rounds; the outputs must be bitwise equal.

    python benchmarks/dev/ab_eager_graph.py --tokens 1 4 16 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_overhead import _events_median_us, _host_median_us, host_speed_us  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import nvfp4_ops
    from nvfp4_ops.kernels import moe_cuda
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
    modes = {"kept+graph": (True, True), "kept": (True, False), "neither": (False, False)}
    print(f"{'case':14s} " + " ".join(f"{m + ' ev':>14s} {m + ' host':>14s}" for m in modes)
          + "  (µs, medians of round medians)")
    find, keep = Repeats.find, Repeats.keep

    def set_mode(kept: bool, graphs: bool) -> None:
        moe_cuda.EAGER_GRAPHS = graphs
        Repeats.find = find if kept else (lambda self, *a: None)
        Repeats.keep = keep if kept else (lambda self, *a: None)

    def ab(name, call, mode_names):
        outs = {}
        eager = {m: [] for m in mode_names}
        host = {m: [] for m in mode_names}
        for _ in range(args.rounds):
            for m in mode_names:
                set_mode(*modes[m])
                for _ in range(5):
                    outs[m] = call()
                eager[m].append(_events_median_us(call, args.reps))
                host[m].append(_host_median_us(call, args.reps))
        set_mode(True, True)
        first = outs[mode_names[0]]
        same = all(torch.equal(first, o) for o in outs.values())
        cols = " ".join(f"{statistics.median(eager[m]):14.1f} {statistics.median(host[m]):14.1f}"
                        if m in eager else f"{'-':>14s} {'-':>14s}" for m in modes)
        print(f"{name:14s} {cols}  {'bitwise equal' if same else 'OUTPUTS DIFFER'}",
              flush=True)

    for num_tokens in args.tokens:
        x = torch.randn(num_tokens, s.hidden, device="cuda").to(torch.bfloat16)
        ids, weights = random_routing(num_tokens, s.experts, s.top_k, device="cuda")

        def call(x=x, ids=ids, weights=weights):
            return nvfp4_ops.moe(x, ids, weights, *experts.args(),
                                 global_num_experts=s.experts, swiglu_limit=s.swiglu_limit,
                                 wperm=True)

        ab(f"moe T={num_tokens}", call, list(modes))
    n, k = 7168, 18432
    w = nvfp4_ops.to_wfrag_(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8,
                                          device="cuda"))
    ws = torch.full((n, k // 16), 0x38, dtype=torch.uint8, device="cuda").view(
        torch.float8_e4m3fn)
    wg = torch.ones((), device="cuda")
    xl = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    ab("linear M=1", lambda: nvfp4_ops.linear(xl, w, ws, wg, wfrag=True), ["kept", "neither"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
