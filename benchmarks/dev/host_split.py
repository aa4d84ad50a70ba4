"""Where an eager call's host time goes, function by function (a diagnostic, CUDA only).

Wraps the functions an eager ``nvfp4_ops.moe`` / ``nvfp4_ops.linear`` call passes through
with ``perf_counter_ns`` timers (inclusive times: a wrapped function's time includes the
wrapped functions it calls; the CUDA graphs' replays and the output allocations included),
runs ``--calls`` eager calls of each case of ``bench_overhead.py`` and prints the mean µs per
call of each wrapped function, next to the whole call's host time with and without the
wrappers (their own cost shows as the difference). Triton launches are timed per kernel
(``JITFunction.run`` and ``_launch.Launcher``); CuTeDSL binaries through the callable
``linear_cuda.compiled`` returns.

    python benchmarks/dev/host_split.py [--calls 500]
"""

from __future__ import annotations

import argparse
import collections
import importlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_totals: dict[str, int] = collections.defaultdict(int)
_counts: dict[str, int] = collections.defaultdict(int)


def _timed(name, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            _totals[name] += time.perf_counter_ns() - t0
            _counts[name] += 1

    wrapper.__wrapped__ = fn
    return wrapper


def _patch(module: str, attr: str, label: str | None = None) -> None:
    mod = importlib.import_module(module)
    setattr(mod, attr, _timed(label or f"{module.rsplit('.', 1)[-1]}.{attr}",
                              getattr(mod, attr)))


def install() -> None:
    import triton

    from nvfp4_ops.kernels import linear_cuda, moe_cuda
    from nvfp4_ops.kernels.triton import _launch

    for module, attr in [
        ("nvfp4_ops.ops._eager", "direct"),
        ("nvfp4_ops.ops.moe", "_check"),
        ("nvfp4_ops.ops.linear", "_check"),
        ("nvfp4_ops._device", "require_supported_gpu"),
        ("nvfp4_ops.kernels", "cuda_kernel"),
        ("nvfp4_ops.kernels.dispatch", "plan_moe"),
        ("nvfp4_ops.kernels.dispatch", "plan_linear"),
        ("nvfp4_ops.kernels.moe_cuda", "moe_routing"),
        ("nvfp4_ops.kernels.moe_cuda", "gather_rows"),
        ("nvfp4_ops.kernels.moe_cuda", "combine"),
        ("nvfp4_ops.kernels.moe_cuda", "moe_forward"),
        ("nvfp4_ops.kernels.moe_cuda", "_forward"),
        ("nvfp4_ops.kernels.moe_cuda", "run_gemm"),
        ("nvfp4_ops.kernels.linear_cuda", "run_gemm"),
        ("nvfp4_ops.kernels.linear_cuda", "memo_views"),
        ("nvfp4_ops.kernels.moe_cuda", "memo_views"),
        ("nvfp4_ops.kernels.linear_cuda", "streamk_workspace"),
        ("nvfp4_ops.kernels.linear_cuda", "_realigned"),
        ("nvfp4_ops.ops.linear", "_linear_cuda"),
        ("nvfp4_ops.ops.moe", "_moe_cuda"),
        ("nvfp4_ops.kernels.eager_graphs", "caller_capturing"),
    ]:
        try:
            _patch(module, attr)
        except AttributeError:
            print(f"(no {module}.{attr})")
    # the kept launches of repeated calls (nvfp4_ops.ops._eager.Repeats)
    from nvfp4_ops.ops._eager import Repeats

    for method in ("find", "keep"):
        setattr(Repeats, method, _timed(f"_eager.Repeats.{method}", getattr(Repeats, method)))
    # the CUDA graphs repeated calls replay (kernels/eager_graphs.py), and the output
    # allocation every call makes
    from nvfp4_ops.kernels.eager_graphs import AddressGraphs

    AddressGraphs.run = _timed("eager_graphs.AddressGraphs.run", AddressGraphs.run)
    torch.cuda.CUDAGraph.replay = _timed("torch.cuda.CUDAGraph.replay",
                                         torch.cuda.CUDAGraph.replay)
    torch.Tensor.new_empty = _timed("torch.Tensor.new_empty", torch.Tensor.new_empty)
    # moe_forward binds its GEMM launcher as a default argument
    kw = moe_cuda.moe_forward.__wrapped__.__kwdefaults__
    kw["gemm"] = linear_cuda.run_gemm
    compiled = linear_cuda.compiled
    binaries: dict[int, object] = {}

    def timed_compiled(config):
        fn = compiled(config)
        wrapped = binaries.get(id(fn))
        if wrapped is None:
            wrapped = binaries[id(fn)] = _timed(f"binary {type(config).__name__}", fn)
        return wrapped

    linear_cuda.compiled = _timed("linear_cuda.compiled (lookup + binary)", timed_compiled)

    def timed_method(method, kernel_name):
        """``method`` timed under "triton <kernel name>" (``kernel_name(self)``)."""
        def wrapper(self, *args, **kwargs):
            t0 = time.perf_counter_ns()
            try:
                return method(self, *args, **kwargs)
            finally:
                name = f"triton {kernel_name(self)}"
                _totals[name] += time.perf_counter_ns() - t0
                _counts[name] += 1

        return wrapper

    # kernels launched through _launch.Launcher (a miss also runs JITFunction.run, counted
    # there too: once per compiled variant, negligible over --calls) and the others
    triton.runtime.jit.JITFunction.run = timed_method(triton.runtime.jit.JITFunction.run,
                                                      lambda f: f.fn.__name__)
    _launch.Launcher.launch = timed_method(_launch.Launcher.launch,
                                           lambda launcher: launcher.kernel.fn.__name__)
    # repeated eager MoE calls launch through launches bound to their buffers
    _launch.BoundLaunch.__call__ = timed_method(
        _launch.BoundLaunch.__call__,
        lambda bound: f"{bound._launch.launcher.kernel.fn.__name__} (bound)")


def _host_us(fn, calls: int) -> float:
    times = []
    for i in range(calls):
        if i % 50 == 0:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2] / 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=500)
    args = p.parse_args(argv)
    from bench_overhead import _cases

    cases = _cases()
    for fn in cases.values():
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    plain = {name: _host_us(fn, args.calls) for name, fn in cases.items()}
    install()
    for name, fn in cases.items():
        for _ in range(3):
            fn()
        _totals.clear()
        _counts.clear()
        wrapped = _host_us(fn, args.calls)
        print(f"--- {name}: host median {plain[name]:.1f} µs plain, {wrapped:.1f} µs wrapped;"
              f" mean µs per call (inclusive), calls per call")
        for key in sorted(_totals, key=_totals.get, reverse=True):
            print(f"  {key:44s} {_totals[key] / 1e3 / args.calls:8.1f} "
                  f"{_counts[key] / args.calls:5.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
