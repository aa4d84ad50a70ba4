"""A/B of the eager MoE call's GEMM graphs (``moe_cuda.EAGER_GRAPHS``; CUDA only).

V4-Flash (wperm weights) at each ``--tokens``: one eager ``nvfp4_ops.moe`` call timed with CUDA
events around the Python call (host and device time, as ``bench_overhead.py eager`` does) and
its host time alone, with the GEMMs replayed from the captured graph and launched one by one,
alternating over ``--rounds`` rounds; the outputs must be bitwise equal.

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
    print(f"{'T':>4s} {'eager graph':>12s} {'eager plain':>12s} {'host graph':>11s} "
          f"{'host plain':>11s}  (µs, medians of round medians)")
    for num_tokens in args.tokens:
        x = torch.randn(num_tokens, s.hidden, device="cuda").to(torch.bfloat16)
        ids, weights = random_routing(num_tokens, s.experts, s.top_k, device="cuda")

        def call(x=x, ids=ids, weights=weights):
            return nvfp4_ops.moe(x, ids, weights, *experts.args(),
                                 global_num_experts=s.experts, swiglu_limit=s.swiglu_limit,
                                 wperm=True)

        outs, eager, host = {}, {True: [], False: []}, {True: [], False: []}
        for _ in range(args.rounds):
            for on in (True, False):
                moe_cuda.EAGER_GRAPHS = on
                for _ in range(5):
                    outs[on] = call()
                eager[on].append(_events_median_us(call, args.reps))
                host[on].append(_host_median_us(call, args.reps))
        moe_cuda.EAGER_GRAPHS = True
        same = torch.equal(outs[True], outs[False])
        med = {k: (statistics.median(eager[k]), statistics.median(host[k])) for k in eager}
        print(f"{num_tokens:4d} {med[True][0]:12.1f} {med[False][0]:12.1f} {med[True][1]:11.1f} "
              f"{med[False][1]:11.1f}  {'bitwise equal' if same else 'OUTPUTS DIFFER'}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
