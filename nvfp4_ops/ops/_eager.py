"""How the ops keep an eager call's host time small: when a public wrapper may call its op's
CUDA implementation directly (:func:`direct`), and the launches that repeated calls reuse
(:class:`Repeats`).

An eager call through ``torch.ops.nvfp4.*`` pays the dispatcher's Python layers of a
``torch.library.custom_op`` (autograd wrapper, redispatch, the output-aliasing check, the
dynamo-disabled frame) before it reaches the implementation: on the H200's host that was the
larger part of an eager MoE call's host time (``benchmarks/bench_overhead.py --cprofile``).
The CUDA implementation registered for the op is an ordinary Python function, so a plain
eager call can run it directly and get the same result.

Only when nothing could observe the difference: not while dynamo traces (``torch.compile``,
``torch.export``: they must see the op), no active ``TorchDispatchMode`` / torch function mode
(fake tensors, tracers, profilers of operators), every tensor a plain ``torch.Tensor`` or
``nn.Parameter`` on CUDA, and no autograd to record (the ops define no derivative; through
the dispatcher a backward would fail loudly, which a direct call must not hide).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from nvfp4_ops import _env, _validate
from nvfp4_ops._weak import entry_refs

__all__ = ["Repeats", "direct"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def direct(*tensors: torch.Tensor | None) -> bool:
    """Whether the wrapper may run the CUDA implementation for these arguments directly
    (``None`` entries are optional tensors that were not given)."""
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return False
    if torch._C._is_torch_function_mode_enabled():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN or not t.is_cuda or (grad and t.requires_grad):
            return False
    return True


class Repeats:
    """The prepared launches of an op's CUDA calls, reused by later calls that repeat one.

    What an op does on the host before its kernels run (the metadata and scalar checks, the
    GPU check, the kernel plan, the weights' kernel-form views) depends only on the
    arguments' metadata, the Python scalars and the switches. A call that repeats all of them
    with the same weight tensor objects would get the same answers, so it runs the launch
    that the first (fully checked) call prepared instead: a layer's weights are the same
    objects call after call, and its per-call inputs keep their sizes (one entry per size).
    Never looser than the checks: an entry is found only when every input the checks read
    is the same as when they passed.

    What must match, per entry:

    * each weight: the same object (by ``id``; the entry goes when one of them is freed),
      with the same address (which, under CUDA's unified addressing, tells the device),
      dtype, shape and strides (a storage swapped in through ``.data`` misses; an in-place
      write of the values does not, the launch reads memory);
    * each per-call input (activations, ids, router weights): dtype, shape, strides, device;
    * the scalar arguments (equal values; a NaN never equals itself, so never repeats);
    * the switches the checks and the kernel lookup read: ``NVFP4_OPS_BACKEND``,
      ``NVFP4_OPS_VALUE_CHECKS`` and :func:`nvfp4_ops.set_value_checks` (raw values).

    No entry is kept while the per-call value checks are on (they read device data on every
    call). A launch holds no reference to the weight tensor objects, only to the views of
    their storage it was built from, so it never keeps a layer alive.

    Why: the checks, the GPU check, the plan lookup and the weight views took ~8 µs of an
    eager ``linear`` call's ~19 µs of host time on the H200's host (``python
    benchmarks/dev/host_split.py``), in front of a ~30 µs kernel; with kept launches an eager
    ``linear`` M = 1 took 53.5 µs instead of 72.0 in one process (``python
    benchmarks/dev/ab_eager_graph.py``, ``benchmarks/results/eager_ab_h200.log``).
    """

    #: per-call sizes (entries) kept per weight set; beyond it they are all dropped
    PER_WEIGHTS = 256
    #: weight sets kept (each goes with its tensors anyway); beyond it all are dropped
    MAX_WEIGHTS = 4096

    def __init__(self) -> None:
        # id of each weight -> (weak references, their signature, {call key: launch})
        self._by_weights: dict[tuple, tuple[tuple, list, dict]] = {}

    def find(self, inputs: tuple[torch.Tensor, ...], weights: tuple[torch.Tensor | None, ...],
             scalars: tuple) -> Callable | None:
        """The launch kept for a call with these per-call ``inputs``, ``weights`` (None:
        an optional tensor not given) and ``scalars``, or None."""
        hit = self._by_weights.get(tuple(map(id, weights)))
        if hit is None or hit[1] != _weight_sig(weights):
            return None
        return hit[2].get(_call_key(inputs, scalars))

    def keep(self, inputs: tuple[torch.Tensor, ...], weights: tuple[torch.Tensor | None, ...],
             scalars: tuple, launch: Callable) -> None:
        """Keep ``launch`` for calls repeating this one, which passed every check. Nothing is
        kept while the per-call value checks are on."""
        if _validate.value_checks_on():
            return
        key = tuple(map(id, weights))
        sig = _weight_sig(weights)
        hit = self._by_weights.get(key)
        if hit is None or hit[1] != sig:
            if len(self._by_weights) >= self.MAX_WEIGHTS:
                self._by_weights.clear()
            hit = self._by_weights[key] = (entry_refs(self._by_weights, key, weights), sig, {})
        launches = hit[2]
        if len(launches) >= self.PER_WEIGHTS:
            launches.clear()
        launches[_call_key(inputs, scalars)] = launch

    def clear(self) -> None:
        """Drop every kept launch."""
        self._by_weights.clear()

    def __len__(self) -> int:
        return sum(len(hit[2]) for hit in self._by_weights.values())


def _weight_sig(weights: tuple[torch.Tensor | None, ...]) -> list:
    # no device: under CUDA's unified addressing the address tells the device (the per-call
    # inputs' device is in the call key, and the checks made the weights' match it). A plain
    # loop: a comprehension costs a frame per call on Python 3.11, and this runs on every
    # eager call
    sig = []
    for t in weights:
        sig.append(None if t is None else (t.data_ptr(), t.dtype, t.shape, t.stride()))
    return sig


#: the switches a kept launch depends on: the kernel lookup (backend) and the value checks
_switches = _env.Snapshot(_env.BACKEND, _env.VALUE_CHECKS)


def _call_key(inputs: tuple[torch.Tensor, ...], scalars: tuple) -> tuple:
    # flat, and the device as its index (making and hashing a torch.device took ~0.3 µs per
    # input on a CPU host): kept launches come from calls whose inputs were all on one CUDA
    # device, and any other placement (CPU and meta read -1) misses them and meets the checks
    key = []
    for t in inputs:
        key += (t.dtype, t.shape, t.stride(), t.get_device())
    return (*key, *scalars, *_switches(), _validate.value_checks_override())
