"""A/B helper (diagnostics, needs a GPU): the MoE sweep of ``bench_moe.py --sweep`` with the
WGMMA kernel family swapped to other modules under ``nvfp4_ops.kernels.cute``, one after the
other in the same process (same GPU state, same routing seeds).

Usage: ``python benchmarks/dev_ab_wgmma.py MODULE[,MODULE...] T [T ...]``. Example (the
committed kernel against the working copy; results in benchmarks/results/h200_2026-11-30_s3/
wgmma_ab_h200.txt)::

    git show HEAD:nvfp4_ops/kernels/cute/w4a16_wgmma.py \\
        > nvfp4_ops/kernels/cute/w4a16_wgmma_before.py
    python benchmarks/dev_ab_wgmma.py w4a16_wgmma_before,w4a16_wgmma 512

The disk cache is off here: two versions of the kernel give their configs the same names, so a
cached object of one would be loaded for the other.
"""

from __future__ import annotations

import os
import sys

os.environ["NVFP4_OPS_DISK_CACHE"] = "0"

from nvfp4_ops.kernels import linear_cuda  # noqa: E402


def main() -> None:
    modules, tokens = sys.argv[1].split(","), sys.argv[2:]
    sys.path.insert(0, "benchmarks")
    import bench_moe

    for module in modules:
        print(f"== {module}", flush=True)
        linear_cuda._WGMMA = module
        linear_cuda.choose_config.cache_clear()
        linear_cuda.grouped_supported.cache_clear()
        bench_moe.main(["--sweep", "--shapes", "v4-flash", "--tokens", *tokens, "--reps", "10"])


if __name__ == "__main__":
    main()
