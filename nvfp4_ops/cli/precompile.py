"""``python -m nvfp4_ops precompile --shape v4-flash|v4-pro|tiny [...]``: fill the kernel cache.

On a CPU-only machine this compiles every CuTeDSL variant the shapes can reach for sm_90a
(how CI and reviewers check that every kernel compiles); with a GPU it also runs each once
(that is :func:`nvfp4_ops.warmup`). Binaries land in the disk cache
(``NVFP4_OPS_CACHE_DIR``), so a later process loads instead of compiling.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvfp4_ops precompile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", required=True,
                        help="model shape name (repeatable): v4-flash, v4-pro, tiny")
    parser.add_argument("--no-moe", action="store_true", help="skip the MoE grouped GEMMs")
    parser.add_argument("--no-run", action="store_true",
                        help="compile only, even when a GPU is present")
    args = parser.parse_args(argv)
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before cutlass is imported
    import torch

    import nvfp4_ops
    from nvfp4_ops import _compile

    for name in args.shape:
        nvfp4_ops.get_shape(name)  # unknown names fail before any compile
    run = torch.cuda.is_available() and not args.no_run
    print(f"precompile: shapes {args.shape}, arch {_compile.target_arch()}, "
          f"{'compile + run once' if run else 'compile only'}, cache "
          f"{_compile.cache_dir() or 'disabled'}", flush=True)
    start = time.perf_counter()
    names = nvfp4_ops.warmup(args.shape, run=run, include_moe=not args.no_moe,
                             progress=lambda line: print(line, flush=True))
    print(f"precompile: {len(names)} variants ready ({_compile.compile_count()} compiled, "
          f"{len(names) - _compile.compile_count()} from cache) in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
