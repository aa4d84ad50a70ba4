"""A/B helper (diagnostics, needs a GPU): the MoE sweep of ``bench_moe.py --sweep`` with the
k-permuted activation layout (``nvfp4_ops/kernels/kperm.py``) switched off, then on (as the op
runs it). Both runs use the same kernels otherwise, and compile / load their own configs.
"Off" switches both permuted orders off: the WGMMA tiles' 32-block order and the 8-token
tiles' pair order; ``benchmarks/dev_ab_pairs.py`` A/Bs the pair order alone, per GEMM.

Usage: ``python benchmarks/dev_ab_kperm.py T [T ...]`` (e.g. ``512 4096``).
"""

from __future__ import annotations

import sys

from nvfp4_ops.kernels import linear_cuda


def main() -> None:
    tokens = sys.argv[1:] or ["512"]
    sys.path.insert(0, "benchmarks")
    import bench_moe

    shipped = linear_cuda.grouped_kperm
    for label, rule in (("natural k order", lambda *_: False), ("k-permuted", shipped)):
        linear_cuda.grouped_kperm = rule  # moe_cuda and bench_moe look it up at call time
        print(f"== {label}", flush=True)
        bench_moe.main(["--sweep", "--shapes", "v4-flash", "--tokens", *tokens, "--reps", "10"])
    linear_cuda.grouped_kperm = shipped


if __name__ == "__main__":
    main()
