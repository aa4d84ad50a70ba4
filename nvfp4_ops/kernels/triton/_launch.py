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

A caller that repeats one launch with most arguments unchanged (the MoE's eager decode
calls: the same buffers and sizes, new inputs) builds a :class:`Launch` once and binds it
(:class:`BoundLaunch`): each repeat then computes the key parts of the new values only, not
of every argument.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton

__all__ = ["BoundLaunch", "Launch", "Launcher"]

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


def _tensor_part(dtype: torch.dtype, ptr: int) -> tuple:
    """A tensor argument's key part: its dtype and whether its address is 16-byte aligned."""
    return (dtype, ptr % 16 == 0)


def _part(a, const: bool, spec: bool):
    """The launch-key part of one argument (module docstring)."""
    if const:
        return a
    if isinstance(a, torch.Tensor):
        return _tensor_part(a.dtype, a.data_ptr())
    if isinstance(a, bool) or not isinstance(a, int):
        return type(a)
    size = 0 if _I32[0] <= a < _I32[1] else (1 if a < 2**63 else 2)
    return (size, a == 1, a % 16 == 0) if spec else size


def _run(compiled, grid: tuple[int, int, int], device: int, args) -> None:
    """Launch a compiled kernel on torch's current stream of ``device``."""
    stream = torch._C._cuda_getCurrentRawStream(device)
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function,
                 compiled.packed_metadata, None, None, None, *args)


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
        parts = tuple([_part(a, const, spec) for a, const, spec in
                       zip(args, self._constexpr, self._specialised, strict=True)])
        return (device, tuple(options.items()), parts)

    def part(self, index: int, value):
        """The launch-key part of ``value`` as the argument at position ``index``."""
        return _part(value, self._constexpr[index], self._specialised[index])

    def __call__(self, grid: tuple[int, int, int], *args, **options) -> None:
        self.launch(grid, args, options)

    def launch(self, grid: tuple[int, int, int], args: tuple | list, options: dict):
        """Launch (as ``__call__``); returns the compiled kernel a direct launch of the same
        key may reuse, or None where launches go through Triton (module docstring)."""
        first = args[0]
        if (not (self._direct and isinstance(first, torch.Tensor) and first.is_cuda)
                or _hooks_installed()):
            self.kernel[grid](*args, **options)
            return None
        # Triton launches on the current device (as kernel[grid] does)
        device = torch._C._cuda_getDevice()
        key = self.key(device, args, options)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **options)
            if not (hasattr(compiled, "function") and hasattr(compiled, "packed_metadata")):
                return None
            self._compiled[key] = compiled
            return compiled
        _run(compiled, grid, device, args)
        return compiled


class Launch(NamedTuple):
    """One launch, not yet made: ``launcher(grid, *args, **options)``."""

    launcher: Launcher
    grid: tuple[int, int, int]
    args: tuple
    options: dict

    def __call__(self) -> None:
        self.launcher.launch(self.grid, self.args, self.options)

    def bind(self, *names: str) -> BoundLaunch:
        """This launch, to repeat with new values of the kernel parameters ``names``
        (:class:`BoundLaunch`).

        Raises:
            ValueError: a name that is not a parameter of the kernel.
        """
        params = list(self.launcher.kernel.arg_names)
        for name in names:
            if name not in params:
                raise ValueError(f"{name!r} is not a parameter of the kernel; it has {params}")
        return BoundLaunch(self, tuple(params.index(name) for name in names))


class BoundLaunch:
    """A :class:`Launch` repeated with new values at some argument positions (made by
    :meth:`Launch.bind`): ``bound(*values)`` launches ``launch.args`` with ``values`` at the
    positions ``dynamic``.

    Why: a caller that repeats one launch with mostly the same arguments (an eager decode
    call of the MoE, whose buffers and sizes are those of the previous call) need not pay
    for every argument again. The first call goes through :meth:`Launcher.launch` (the whole
    key: compiling, or finding the compiled kernel); later calls compute only the key parts
    of the new values (and the current device) and, when they equal those the compiled
    kernel was found for, launch it directly, passing the unchanged tensors as the device
    addresses read once at the first call (the compiled kernel's launcher takes an int for a
    pointer, and skips the per-tensor ``data_ptr()`` call and driver pointer query it makes
    otherwise). Anything else (another dtype, an unaligned pointer, an int of another width,
    launch hooks) goes through the launcher again, so the result is always ``kernel[grid]``'s.

    The unchanged tensors stay referenced by the bound launch: their memory cannot be freed
    while it exists.
    """

    def __init__(self, launch: Launch, dynamic: tuple[int, ...]) -> None:
        # keep no reference to the values the launch was built with (a caller's inputs)
        self._launch = launch._replace(args=())
        self._dynamic = dynamic
        self._args = list(launch.args)
        for i in dynamic:
            self._args[i] = None
        # the direct launch's arguments: the unchanged tensors as their addresses
        self._raw = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in self._args]
        self._compiled = None
        self._device = -1
        self._parts: list = []

    def __call__(self, *values) -> None:
        launch = self._launch
        if self._compiled is not None:
            raw = self._raw.copy()
            parts = []
            launcher = launch.launcher
            for i, v in zip(self._dynamic, values, strict=True):
                if isinstance(v, torch.Tensor):
                    ptr = raw[i] = v.data_ptr()
                    parts.append(_tensor_part(v.dtype, ptr))
                else:
                    raw[i] = v
                    parts.append(launcher.part(i, v))
            device = torch._C._cuda_getDevice()
            if device == self._device and parts == self._parts and not _hooks_installed():
                _run(self._compiled, launch.grid, device, raw)
                return
        args = self._args.copy()
        for i, v in zip(self._dynamic, values, strict=True):
            args[i] = v
        self._compiled = launch.launcher.launch(launch.grid, args, launch.options)
        if self._compiled is not None:  # a direct launch: a CUDA device is current
            self._device = torch._C._cuda_getDevice()
            self._parts = [launch.launcher.part(i, v)
                           for i, v in zip(self._dynamic, values, strict=True)]
