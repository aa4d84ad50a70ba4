"""GPU kernels and their torch-side launchers.

Layout, from the ops down: ``linear_cuda`` / ``moe_cuda`` (the CUDA implementations of the
ops and the one GEMM launcher), ``dispatch`` (the policy: sizes -> plan), then the kernels
themselves (``cute/`` CuTeDSL, ``triton/`` Triton). The weight and activation orders they
read are in :mod:`nvfp4_ops.orders` (pure torch, shared with the references).

Nothing here is imported when ``nvfp4_ops`` is imported: the ops ask :func:`cuda_kernel` for
their CUDA implementation on the first CUDA call, so importing the package never pulls in
CuTeDSL or Triton and never initialises CUDA.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nvfp4_ops import _env

__all__ = ["CUDA_OPS", "cuda_kernel", "describe", "forced_reference"]

#: the ops that have a CUDA implementation (:func:`cuda_kernel`); the others run their
#: pure-torch reference on the GPU
CUDA_OPS = ("linear", "mlp", "moe")


def forced_reference() -> bool:
    """``NVFP4_OPS_BACKEND=reference`` makes CUDA tensors run the references (for debugging).

    Raises:
        nvfp4_ops._env.NVFP4EnvError: the variable holds something else than auto/reference.
    """
    return _env.backend() == "reference"


def cuda_kernel(op: str) -> Callable | None:
    """The function that prepares ``op``'s CUDA launch, or None when the op has none (or the
    reference is forced). Imported on first use: loading it imports CuTeDSL and Triton.

    It takes the op's validated arguments and returns the launch for their sizes (a function
    of the per-call inputs, which the op may keep for repeated calls:
    :class:`nvfp4_ops.ops._eager.Repeats`), or None where no kernel covers the sizes:
    :func:`~nvfp4_ops.kernels.linear_cuda.linear_launch`,
    :func:`~nvfp4_ops.kernels.linear_cuda.mlp_launch`,
    :func:`~nvfp4_ops.kernels.moe_cuda.moe_launch`."""
    if forced_reference() or op not in CUDA_OPS:
        return None
    impl = _impls.get(op)
    if impl is None:  # once per op: an import statement per eager call costs microseconds
        if op == "moe":
            from nvfp4_ops.kernels.moe_cuda import moe_launch as impl
        else:
            from nvfp4_ops.kernels import linear_cuda

            impl = linear_cuda.linear_launch if op == "linear" else linear_cuda.mlp_launch
        _impls[op] = impl
    return impl


_impls: dict[str, Callable] = {}


def describe(op: str, device: torch.device | str) -> str:
    """Which implementation ``op`` runs for tensors on ``device``, in words (for reports)."""
    if torch.device(device).type != "cuda":
        return "CPU reference (pure torch)"
    if forced_reference():
        return "reference on GPU (NVFP4_OPS_BACKEND=reference)"
    if op not in CUDA_OPS:
        return "reference on GPU (no CUDA kernel)"
    where = "moe_cuda.moe_launch" if op == "moe" else f"linear_cuda.{op}_launch"
    return f"CUDA kernel nvfp4_ops.kernels.{where}"
