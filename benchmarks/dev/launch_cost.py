"""Host µs of one launch of a small Triton kernel, by launch path, and of the torch calls an
eager op makes (a diagnostic, CUDA only): the data behind ``kernels/triton/_launch.py``.

Times, for the MoE combine at decode size (T = 1, k = 6, H = 4096): the ``combine`` wrapper,
``kernel[grid]`` (Triton's JIT path), ``_launch.Launcher``, ``_launch.BoundLaunch`` (the
path repeated eager calls take) and the compiled kernel's launcher called bare; then single
torch calls (allocation, views, stream queries). Mean over ``--calls`` back-to-back calls,
host time only.

    python benchmarks/dev/launch_cost.py [--calls 3000]
"""

from __future__ import annotations

import argparse
import time

import torch


def _per_call_us(fn, calls: int) -> float:
    for _ in range(100):
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
    print(f"{'path / call':32s} {'host µs':>8s}")
    for name, fn in cases.items():
        print(f"{name:32s} {_per_call_us(fn, args.calls):8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
