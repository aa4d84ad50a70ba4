"""Host µs of one launch of a small Triton kernel, by launch path, and of the torch calls an
eager op makes (a diagnostic, CUDA only): the data behind ``kernels/triton/_launch.py``.

Times, for the MoE combine at decode size (T = 1, k = 6, H = 4096): the ``combine`` wrapper,
``kernel[grid]`` (Triton's JIT path), ``_launch.Launcher``, ``_launch.BoundLaunch`` (the
path repeated eager calls take) and the compiled kernel's launcher called bare; then single
torch calls (allocation, views, stream queries). Mean over ``--calls`` back-to-back calls,
host time only; next to it the median of one call right after a ``torch.cuda.synchronize()``.

    python benchmarks/dev/launch_cost.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import functools
import time

import torch


def _per_call_us(fn, calls: int) -> float:
    for _ in range(min(calls, 100)):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=3000)
    args = p.parse_args(argv)
    from nvfp4_ops.kernels.triton import _launch, moe_combine

    dev = torch.device("cuda")
    num_tokens, top_k, hidden, rows, block_h = 1, 6, 4096, 48, 1024
    y = torch.randn(rows, hidden, device=dev).to(torch.bfloat16)
    slot_row = torch.arange(num_tokens * top_k, device=dev, dtype=torch.int32)
    out = torch.empty(num_tokens, hidden, device=dev, dtype=torch.bfloat16)
    grid = (num_tokens, hidden // block_h, 1)
    kernel_args = (y, slot_row, out, 1.0, hidden, top_k, block_h, True)
    options = dict(launch_pdl=True)
    launcher = _launch.Launcher(moe_combine._combine_kernel)
    compiled = moe_combine._combine_kernel[grid](*kernel_args, **options)
    stream = torch.cuda.current_stream().cuda_stream
    want = moe_combine.combine(y, slot_row, num_tokens, top_k, 1.0, pdl=True)
    launcher(grid, *kernel_args, **options)
    launcher(grid, *kernel_args, **options)
    torch.cuda.synchronize()
    assert torch.equal(out, want), "the launcher computed something else than the wrapper"
    bound = _launch.Launch(launcher, grid, kernel_args, options).bind("out_ptr",
                                                                      "output_scale")
    bound(out, 1.0)
    buf = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
    cases = {
        "combine() (the op's wrapper)": lambda: moe_combine.combine(
            y, slot_row, num_tokens, top_k, 1.0, pdl=True),
        "kernel[grid](...)": lambda: moe_combine._combine_kernel[grid](*kernel_args, **options),
        "_launch.Launcher": lambda: launcher(grid, *kernel_args, **options),
        "_launch.BoundLaunch (2 new args)": lambda: bound(out, 1.0),
        "compiled.run (bare)": lambda: compiled.run(
            *grid, stream, compiled.function, compiled.packed_metadata, None, None, None,
            *kernel_args),
        "torch.empty [48, 4096] bf16": lambda: torch.empty(rows, hidden, dtype=torch.bfloat16,
                                                           device=dev),
        "slice buf[a:b]": lambda: buf[256:4096],
        "view(dtype)": lambda: buf.view(torch.int32),
        "unsqueeze + expand": lambda: slot_row.unsqueeze(1).expand(num_tokens * top_k, 4),
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "raw current stream": lambda: torch._C._cuda_getCurrentRawStream(0),
        "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
    }
    gemm = _gemm_cases(dev)
    cases.update(gemm)
    print("torch", torch.__version__, "| torch.Tensor.__dlpack_c_exchange_api__:",
          hasattr(torch.Tensor, "__dlpack_c_exchange_api__"), "(tvm-ffi's fast tensor path)")
    tiny = torch.zeros(1, device=dev)
    cases["python only (200 dict lookups)"] = lambda: [cases.get(i) for i in range(200)]
    print(f"{'path / call':32s} {'host µs':>8s} {'after sync':>10s} {'+1 launch':>10s}")
    for name, fn in cases.items():
        # a GEMM runs ~30 µs on the GPU: few enough calls that the launch queue never fills
        # (then the host would wait for the GPU and this would time the kernel)
        calls = min(args.calls, 300) if name in gemm else args.calls
        print(f"{name:32s} {_per_call_us(fn, calls):8.2f} {_after_sync_us(fn, 300):10.2f} "
              f"{_after_sync_us(fn, 300, first=tiny.zero_):10.2f}")
    return 0


def _after_sync_us(fn, calls: int, first=None) -> float:
    """Median host µs of one call made right after ``torch.cuda.synchronize()`` (what an
    eager call timed alone, as ``bench_overhead.py eager`` does, pays); ``first``: an
    untimed call (a tiny kernel launch) between the synchronisation and the timed call."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        if first is not None:
            first()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2] * 1e6


def _gemm_cases(dev: torch.device) -> dict:
    """The CuTeDSL GEMM of an eager ``linear`` M = 1 at (7168, 18432): the binary called bare
    with prepared arguments, the op's kernel (``linear_cuda.linear``: plan, views and launch
    every call), the launch a repeated call keeps (``linear_cuda.linear_launch``) and the public
    wrapper; and tvm-ffi's own cost for the same twelve arguments (``testing.nop``)."""
    import tvm_ffi

    import nvfp4_ops
    from nvfp4_ops.kernels import dispatch, linear_cuda

    n, k = 7168, 18432
    x = torch.zeros(1, k, dtype=torch.bfloat16, device=dev)
    w = nvfp4_ops.to_wfrag_(torch.full((n, k // 2), 0x21, dtype=torch.uint8, device=dev))
    ws = torch.full((n, k // 16), 0x38, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
    wg = torch.ones((), device=dev)
    plan = dispatch.plan_linear(n, k, 1, has_bias=False, order=dispatch.WeightOrder.WFRAG)
    binary = linear_cuda.compiled(plan.config)
    w3, s3 = linear_cuda.kernel_weight(w, ws)
    gv = linear_cuda.per_group_global_view(wg, n)
    out = torch.empty(1, n, dtype=torch.bfloat16, device=dev)
    i32 = torch.zeros(1, dtype=torch.int32, device=dev)
    f32 = torch.zeros(1, dtype=torch.float32, device=dev)
    b16 = torch.zeros(1, dtype=torch.bfloat16, device=dev)
    gemm_args = (x, w3, s3, gv, out, i32, i32, f32, b16, i32, f32, float("inf"))
    nop = tvm_ffi.get_global_func("testing.nop")
    return {
        f"GEMM binary, bare ({plan.config.name})"[:32]: lambda: binary(*gemm_args),
        "tvm-ffi nop, same 12 args": lambda: nop(*gemm_args),
        "linear_cuda.linear (op kernel)": lambda: linear_cuda.linear(x, w, ws, wg, None, True),
        "kept launch (a repeat's)": functools.partial(
            linear_cuda.linear_launch(x, w, ws, wg, None, True), x),
        "nvfp4_ops.linear (public)": lambda: nvfp4_ops.linear(x, w, ws, wg, wfrag=True),
    }


if __name__ == "__main__":
    raise SystemExit(main())
