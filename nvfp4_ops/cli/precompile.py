"""``python -m nvfp4_ops precompile --shape v4-flash|v4-pro|tiny [...]``: fill the kernel cache.

On a CPU-only machine this compiles every CuTeDSL variant the shapes can reach for sm_90a
(how CI and reviewers check that every kernel compiles); with a GPU it also runs each once
(that is :func:`nvfp4_ops.warmup`). Binaries land in the disk cache
(``NVFP4_OPS_CACHE_DIR``), so a later process loads instead of compiling.

``--jobs N`` compiles in ``N`` worker processes first (compile only, into the disk cache, which
is safe across processes), then the main process loads every variant from disk and, with a
GPU, runs each once: on a 16-core GPU machine this is ~8x faster than compiling one variant
after another. Needs the disk cache (not with ``NVFP4_OPS_DISK_CACHE=0``); each worker holds
its own CuTeDSL toolchain (~1 GB of memory).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _compile_only(cfg) -> tuple[str, int]:
    """Worker: compile (or find on disk) one config, no CUDA; returns (name, compiles)."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4_ops import _compile
    from nvfp4_ops.kernels import linear_cuda

    before = _compile.compile_count()
    linear_cuda.compiled(cfg)
    return cfg.name, _compile.compile_count() - before


def compile_configs(configs, jobs: int, label: str = "worker") -> int:
    """Compile ``configs`` (kernel configs of any family) into the disk cache with ``jobs``
    spawned worker processes (no CUDA state is inherited), printing one progress line each;
    returns how many were compiled (not found on disk). The A/B scripts use it too."""
    import concurrent.futures
    import multiprocessing

    configs = list(dict.fromkeys(configs))
    compiled = 0
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = [pool.submit(_compile_only, cfg) for cfg in configs]
        for i, fut in enumerate(concurrent.futures.as_completed(futures)):
            name, n = fut.result()
            compiled += n
            print(f"[{i + 1}/{len(configs)}] {name} ({'compiled' if n else 'on disk'}, "
                  f"{label})", flush=True)
    return compiled


def _configs(shapes: list[str], include_moe: bool) -> list:
    """Every kernel config the shapes' layers can reach (what :func:`nvfp4_ops.warmup` runs)."""
    from nvfp4_ops import _warmup

    layers = _warmup.layers_for_shapes(shapes, include_moe=include_moe)
    return [plan.config for plan in _warmup.plans_for(layers)]


def _compile_parallel(shapes: list[str], include_moe: bool, jobs: int) -> int:
    """:func:`compile_configs` over every variant of ``shapes``."""
    return compile_configs(_configs(shapes, include_moe), jobs)


DESCRIPTION = """\
Fill the kernel disk cache for model shapes. On a CPU-only machine this compiles every
CuTeDSL variant the shapes can reach for sm_90a; with a (Hopper) GPU it also runs each once.
Binaries land in the disk cache (NVFP4_OPS_CACHE_DIR, default ~/.cache/nvfp4_ops), so a later
process loads them instead of compiling. --jobs N compiles in N worker processes first (each
holds its own CuTeDSL toolchain, ~1 GB of memory); it needs the disk cache. The MoE's MXFP4
variants (UE8M0 scales, which the vLLM glue runs DeepSeek's own checkpoints on) are included
unless NVFP4_OPS_MXFP4_SCALES=convert."""


def _no_cache_reason() -> str:
    from nvfp4_ops import _env

    if not _env.flag(_env.DISK_CACHE, True):
        return f"{_env.DISK_CACHE} is off"
    return f"the folder under {_env.CACHE_DIR} cannot be used (see the warning above)"


def main(argv: list[str], prog: str = "python -m nvfp4_ops precompile") -> int:
    from nvfp4_ops.shapes import SHAPES

    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", required=True, choices=sorted(SHAPES),
                        help="model shape (repeatable)")
    parser.add_argument("--no-moe", action="store_true", help="skip the MoE grouped GEMMs")
    parser.add_argument("--no-run", action="store_true",
                        help="compile only, even when a GPU is present")
    parser.add_argument("--jobs", type=int, default=1,
                        help="compile in this many worker processes first (default 1: none)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before cutlass is imported
    import torch

    import nvfp4_ops
    from nvfp4_ops import _compile, _device, _warmup

    run = torch.cuda.is_available() and not args.no_run
    try:
        if run:
            _device.require_supported_gpu(torch.device("cuda", torch.cuda.current_device()))
        folder = _compile.cache_dir()
        mx_shapes = [name for name in dict.fromkeys(args.shape)
                     if any(getattr(layer, "mx", False) for layer in
                            _warmup.layers_for_shapes([name], include_moe=not args.no_moe))]
    except _device.NVFP4UnsupportedGPUError as exc:
        parser.error(f"{exc} (--no-run compiles without running)")
    except nvfp4_ops.NVFP4EnvError as exc:
        parser.error(str(exc))
    mx = f" (MXFP4 variants of {', '.join(mx_shapes)} too)" if mx_shapes else ""
    print(f"precompile: shapes {args.shape}{mx}, arch "
          f"{_compile.target_arch()}, {'compile + run once' if run else 'compile only'}, cache "
          f"{folder or 'memory only'}", flush=True)
    start = time.perf_counter()
    worker_compiles = 0
    if args.jobs > 1:
        if folder is None:
            parser.error(f"--jobs needs the disk cache ({_no_cache_reason()})")
        try:
            worker_compiles = _compile_parallel(args.shape, not args.no_moe, args.jobs)
        except Exception as exc:  # noqa: BLE001 - the serial pass below still compiles all
            print(f"precompile: the {args.jobs} compile workers failed ({type(exc).__name__}: "
                  f"{exc}); compiling in this process instead", file=sys.stderr, flush=True)
        else:
            print(f"precompile: {worker_compiles} compiled by {args.jobs} workers in "
                  f"{time.perf_counter() - start:.1f} s; loading"
                  f"{' and running' if run else ''}", flush=True)
    names = nvfp4_ops.warmup(args.shape, run=run, include_moe=not args.no_moe,
                             progress=lambda line: print(line, flush=True))
    cute = len(_configs(args.shape, not args.no_moe))
    compiled = _compile.compile_count() + worker_compiles
    triton = f", {len(names) - cute} Triton MoE kernels run" if len(names) > cute else ""
    print(f"precompile: {cute} CuTeDSL variants ready ({compiled} compiled, "
          f"{cute - compiled} from the disk cache){triton} in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
