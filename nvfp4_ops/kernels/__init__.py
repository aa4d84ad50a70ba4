"""GPU kernels, one folder per backend (``cute/`` CuTeDSL, ``triton/`` Triton).

Nothing here is imported when ``nvfp4_ops`` is imported: the ops look their CUDA kernel up
lazily with :func:`cuda_kernel` on the first CUDA call, so importing the package never pulls
in CuTeDSL and never initialises CUDA.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

import torch

__all__ = ["CUDA_KERNELS", "cuda_kernel", "describe", "forced_reference"]

#: op name -> "module:function" of its CUDA implementation. An op missing here runs its
#: pure-torch reference on the GPU (exact but slow, and not CUDA-graph safe for ``moe``).
CUDA_KERNELS: dict[str, str] = {
    "linear": "nvfp4_ops.kernels.linear_cuda:linear",
    "mlp": "nvfp4_ops.kernels.linear_cuda:mlp",
    "moe": "nvfp4_ops.kernels.moe_cuda:moe_cuda",
}


def forced_reference() -> bool:
    """``NVFP4_OPS_BACKEND=reference`` makes CUDA tensors run the references (for debugging)."""
    return os.environ.get("NVFP4_OPS_BACKEND", "") == "reference"


def cuda_kernel(op: str) -> Callable | None:
    """The CUDA implementation of ``op``, or None when it has none (or the reference is forced)."""
    if forced_reference() or op not in CUDA_KERNELS:
        return None
    module, fn = CUDA_KERNELS[op].split(":")
    return getattr(importlib.import_module(module), fn)


def describe(op: str, device: torch.device | str) -> str:
    """Which implementation ``op`` runs for tensors on ``device``, in words (for reports)."""
    if torch.device(device).type != "cuda":
        return "CPU reference (pure torch)"
    if forced_reference():
        return "reference on GPU (NVFP4_OPS_BACKEND=reference)"
    if op not in CUDA_KERNELS:
        return "reference on GPU (no CUDA kernel yet)"
    return f"CUDA kernel {CUDA_KERNELS[op]}"
