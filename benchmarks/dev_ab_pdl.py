"""A/B helper (diagnostics, needs a GPU): the MoE with programmatic dependent launch (PDL)
off / on, in one process.

``pdl`` of ``moe_cuda.moe_forward``: off (plain launches), or on (``StreamConfig.pdl`` /
``WgmmaConfig.pdl`` for the streamed 8-token and the WGMMA GEMMs, whose producers stream
weights before waiting for the previous kernel; the Triton gather and combine are
PDL-launched and the routing kernel lets the gather launch early). The session-5 results
(benchmarks/results/h200_2026-12-01_s5/pdl/) were taken with an earlier three-mode version
that also had "every GEMM thread waits first", and before the WGMMA GEMMs took pdl.

For each ``T``: a correctness pass first (on bitwise equal to off and close to
``moe_reference``; then one CUDA graph per mode captured once and replayed ``--replays`` times
with new hidden states and new routing copied in, each replay bitwise equal to eager off),
then the whole op timed as its own CUDA graph with L2 flushed before every replay
(``bench_moe.time_graph``), modes alternating for ``--rounds`` rounds; median µs.

Usage: ``python benchmarks/dev_ab_pdl.py [--shape v4-flash] [--tokens 1 8 32 128 512]
[--reps 30] [--rounds 3] [--replays 10] [--out FILE.json]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _ab  # noqa: E402

MODES = (False, True)


def main(argv: list[str] | None = None) -> int:
    parser = _ab.parser(__doc__, tokens=[1, 8, 32, 128, 512], reps=30)
    parser.add_argument("--shape", default="v4-flash")
    parser.add_argument("--replays", type=int, default=10)
    args = parser.parse_args(argv)
    setup = _ab.gpu_setup(args.shape)
    if setup is None:
        return 2
    bench_moe, shape, experts, flush = setup
    import triton

    from nvfp4_ops.kernels import linear_cuda, moe_cuda
    from nvfp4_ops.kernels.triton import _pdl
    from nvfp4_ops.reference import moe_reference
    from nvfp4_ops.testing import random_routing, rel_l2
    print(f"{shape.name}: {torch.cuda.get_device_name()}, triton {triton.__version__} (PDL "
          f"wrappers: {_pdl.SUPPORTED}), reps {args.reps}, rounds {args.rounds}", flush=True)
    lines = []
    for num_tokens in args.tokens:
        bm, kperm = moe_cuda.op_tile(num_tokens, shape.top_k, shape.experts, shape.hidden,
                                     shape.intermediate)
        hidden, ids, weights = bench_moe.moe_inputs(shape, num_tokens, 11 + num_tokens)

        def run(mode, h=hidden, i=ids, w=weights, bm=bm, kperm=kperm):
            return moe_cuda.moe_forward(h, i, w, *experts, 0, shape.swiglu_limit, 1.0,
                                        gemm=linear_cuda.grouped_w4a16_gemm, block_m=bm,
                                        kperm=kperm, pdl=mode)

        base = run(False)
        want = moe_reference(hidden, ids, weights, *experts, 0, shape.swiglu_limit, 1.0)
        err = rel_l2(base, want)
        ok = err < 4e-3
        for mode in MODES[1:]:
            ok = ok and torch.equal(run(mode), base)
        # graph replay with new inputs and new routing, each replay against eager plain launches
        replay_ok = {}
        for mode in MODES:
            h_s, i_s, w_s = hidden.clone(), ids.clone(), weights.clone()
            run(mode, h_s, i_s, w_s)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y_s = run(mode, h_s, i_s, w_s)
            good = True
            for r in range(args.replays):
                torch.manual_seed(1000 * int(mode) + r)
                h_s.copy_(torch.randn_like(hidden, dtype=torch.float32).to(torch.bfloat16))
                new_ids, new_w = random_routing(num_tokens, shape.experts, shape.top_k,
                                                device="cuda")
                i_s.copy_(new_ids)
                w_s.copy_(new_w)
                graph.replay()
                good = good and torch.equal(y_s, run(False, h_s, i_s, w_s))
            replay_ok[mode] = good
        if not ok or not all(replay_ok.values()):
            print(f"T={num_tokens}: CHECK FAILED (modes equal and rel L2 {err:.2e}: {ok}; "
                  f"graph replays equal eager: {replay_ok})", flush=True)
            return 1
        med, times = _ab.alternate({m: (lambda m=m: run(m)) for m in MODES}, args.rounds,
                                   args.reps, flush)
        print(f"T={num_tokens} block_m={bm}: checked (rel L2 {err:.2e}, {args.replays} graph "
              f"replays per mode with new routing)  " + "  ".join(
                  f"pdl {'on' if m else 'off'} {med[m]:.1f} us ({med[m] / med[False]:.3f})"
                  for m in MODES), flush=True)
        lines.append({"shape": shape.name, "T": num_tokens, "block_m": bm, "rel_l2": err,
                      "us": {str(m): v for m, v in med.items()},
                      "rounds": {str(m): v for m, v in times.items()}})
    if args.out:
        args.out.write_text(json.dumps(lines, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
