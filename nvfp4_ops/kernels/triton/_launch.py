"""Launching the MoE's Triton kernels with little host work.

``kernel[grid](...)`` re-derives Triton's specialisation of every argument, builds its cache
key and queries the device and stream on every call: about 15 µs of host time per launch on
the H200's host, against about 5 µs for calling the compiled kernel's launcher directly
(``benchmarks/dev/launch_cost.py``). An eager decode call of ``nvfp4::moe`` launches three of
these kernels, each running for a few µs, so that difference is a large part of its time.

:class:`Launcher` keeps, per jitted kernel, the compiled kernel of each *launch key*, which
holds everything Triton specialises a compile on:

* the value of every ``tl.constexpr`` argument and the launch options (``num_warps``,
  ``launch_pdl``, ...);
* per tensor argument its dtype and whether its address is a multiple of 16 bytes (Triton's
  pointer-alignment specialisation);
* per int argument its Triton type (i32 / i64 / u64 by range) and, unless the parameter is
  ``do_not_specialize``, whether it is 1 and whether it is a multiple of 16; floats and bools
  are never specialised.

The first call of a key goes through ``kernel[grid]`` (compiling if needed, exactly as
before) and records the compiled kernel it returns; later calls of the same key call that
kernel's launcher on torch's current stream. Whenever the direct call could differ from
``kernel[grid]`` the launch goes through Triton: tensors that are not on CUDA (the
interpreter used by the CPU tests), launch hooks installed (profilers such as Proton read
them), or a Triton whose compiled kernels lack the launcher attributes used here.
"""

from __future__ import annotations

import torch
import triton

__all__ = ["Launcher"]

_I32 = (-(2**31), 2**31)


def _hook_set(hook) -> bool:
    # a plain callable, or (newer Triton) a chain of them that is never None
    return hook is not None and bool(getattr(hook, "calls", True))


def _hooks_installed() -> bool:
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    if runtime is None:
        return True  # unknown Triton: let it launch (and run any hooks) itself
    return (_hook_set(getattr(runtime, "launch_enter_hook", None))
            or _hook_set(getattr(runtime, "launch_exit_hook", None)))


class Launcher:
    """``Launcher(kernel)(grid, *args, **options)``: ``kernel[grid](*args, **options)`` with
    the compiled kernel of the launch key reused (module docstring).

    ``args`` must be every parameter of the kernel, positionally, in declaration order
    (constexprs included): the compiled kernel's launcher takes them that way. ``grid`` is
    a 3-tuple of ints.
    """

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        # Triton's interpreter (TRITON_INTERPRET=1) has no parameter objects: it always
        # launches through kernel[grid], which its CPU tensors take anyway
        params = getattr(kernel, "params", None) or ()
        self._direct = bool(params)
        self._constexpr = tuple(p.is_constexpr for p in params)
        self._specialised = tuple(not p.do_not_specialize for p in params)
        self._compiled: dict[tuple, object] = {}

    def key(self, device: int, args: tuple, options: dict) -> tuple:
        """The launch key of ``args`` and ``options`` on CUDA device ``device`` (module
        docstring)."""
        parts = []
        for a, const, spec in zip(args, self._constexpr, self._specialised, strict=True):
            if const:
                parts.append(a)
            elif isinstance(a, torch.Tensor):
                parts.append((a.dtype, a.data_ptr() % 16 == 0))
            elif isinstance(a, bool) or not isinstance(a, int):
                parts.append(type(a))
            else:
                size = 0 if _I32[0] <= a < _I32[1] else (1 if a < 2**63 else 2)
                parts.append((size, a == 1, a % 16 == 0) if spec else size)
        return (device, tuple(options.items()), tuple(parts))

    def __call__(self, grid: tuple[int, int, int], *args, **options) -> None:
        first = args[0]
        if (not (self._direct and isinstance(first, torch.Tensor) and first.is_cuda)
                or _hooks_installed()):
            self.kernel[grid](*args, **options)
            return
        # Triton launches on the current device (as kernel[grid] does)
        key = self.key(torch.cuda.current_device(), args, options)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **options)
            if hasattr(compiled, "function") and hasattr(compiled, "packed_metadata"):
                self._compiled[key] = compiled
            return
        stream = torch._C._cuda_getCurrentRawStream(key[0])
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function,
                     compiled.packed_metadata, None, None, None, *args)
