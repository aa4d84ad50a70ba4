"""Where a warm start's ``nvfp4_ops.warmup`` spends its time (a diagnostic, CUDA only).

Imports torch and ``nvfp4_ops`` (CUDA initialised), then runs ``nvfp4_ops.warmup(SHAPES)``
under cProfile and prints both times and the ``--top`` functions by cumulative time. Run it
with warm disk caches (``NVFP4_OPS_CACHE_DIR``, ``TRITON_CACHE_DIR`` after a ``precompile``)
to see what a warm start pays.

    python benchmarks/dev/warmup_profile.py [--shape v4-flash] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", help="shape names (default: v4-flash)")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    import torch

    import nvfp4_ops

    torch.cuda.init()
    t1 = time.perf_counter()
    profile = cProfile.Profile()
    profile.enable()
    names = nvfp4_ops.warmup(args.shape or ["v4-flash"])
    torch.cuda.synchronize()
    profile.disable()
    print(f"import {t1 - t0:.2f} s, warmup {time.perf_counter() - t1:.2f} s, "
          f"{len(names)} variants")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
