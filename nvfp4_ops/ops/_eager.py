"""When a public wrapper may call its op's CUDA implementation directly.

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

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ["direct"]

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
