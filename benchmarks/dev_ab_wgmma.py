"""A/B helper (diagnostics, needs a GPU): the MoE sweep of ``bench_moe.py --sweep`` with the
WGMMA kernel family swapped to another module under ``nvfp4_ops.kernels.cute``.

Usage: ``python benchmarks/dev_ab_wgmma.py MODULE T [T ...]``. Example (the first WGMMA
version against the shipped one; results in benchmarks/results/h200_2026-11-30_s2/
wgmma_ab_h200.txt)::

    git show beef517:nvfp4_ops/kernels/cute/w4a16_wgmma.py \\
        > nvfp4_ops/kernels/cute/w4a16_wgmma_v1.py
    python benchmarks/dev_ab_wgmma.py w4a16_wgmma_v1 512 4096
    python benchmarks/dev_ab_wgmma.py w4a16_wgmma 512 4096
"""

from __future__ import annotations

import sys

from nvfp4_ops.kernels import linear_cuda


def main() -> None:
    module, tokens = sys.argv[1], sys.argv[2:]
    linear_cuda._WGMMA = module
    linear_cuda.choose_config.cache_clear()
    linear_cuda.grouped_supported.cache_clear()
    sys.path.insert(0, "benchmarks")
    import bench_moe

    bench_moe.main(["--sweep", "--shapes", "v4-flash", "--tokens", *tokens, "--reps", "10"])


if __name__ == "__main__":
    main()
