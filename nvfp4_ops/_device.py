"""Which GPUs the CUDA kernels run on, checked once per device.

Every CuTeDSL kernel is built for ``sm_90a`` (Hopper's WGMMA, TMA and ``setmaxnreg``), whose
binaries load on compute capability 9.0 only: H100, H200, GH200. On any other GPU the ops'
CUDA paths raise :class:`NVFP4UnsupportedGPUError` naming the GPU, its capability and what is
supported, before any kernel is looked up; ``NVFP4_OPS_BACKEND=reference`` runs the exact
pure-torch references on CUDA tensors of any GPU instead (slow; ``nvfp4.moe``'s reference
syncs per expert, so it cannot be captured in a CUDA graph).

The check costs one dict lookup per call once a device has passed.
"""

from __future__ import annotations

import torch

from nvfp4_ops import _env

__all__ = ["SUPPORTED_CAPABILITIES", "NVFP4UnsupportedGPUError", "require_supported_gpu"]

#: Compute capabilities the CUDA kernels run on (``sm_90a`` binaries).
SUPPORTED_CAPABILITIES = ((9, 0),)

#: CUDA device index -> True once it passed (a failing device is never cached as good).
_supported: dict[int, bool] = {}


class NVFP4UnsupportedGPUError(RuntimeError):
    """The CUDA kernels cannot run on this GPU (not Hopper, compute capability 9.0)."""


def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _current_index() -> int:
    return torch.cuda.current_device()


def require_supported_gpu(device: torch.device) -> None:
    """Raise unless the CUDA kernels can run on ``device`` (a CUDA device), or the reference
    backend is forced (``NVFP4_OPS_BACKEND=reference``: the references run on any GPU).

    Raises:
        NVFP4UnsupportedGPUError: the GPU is not compute capability 9.0; the message names
            the GPU, its capability, what is supported and ``NVFP4_OPS_BACKEND=reference``.
    """
    if _supported.get(device.index):  # a CUDA tensor's device always carries its index
        return
    _check(device)


def _check(device: torch.device) -> None:
    index = _current_index() if device.index is None else device.index
    if _supported.get(index):
        return
    if _env.backend() == "reference":
        return  # not cached: the switch may be unset later, and then the check applies
    major, minor = _capability(index)
    if (major, minor) in SUPPORTED_CAPABILITIES:
        _supported[index] = True
        return
    supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_CAPABILITIES)
    raise NVFP4UnsupportedGPUError(
        f"nvfp4_ops: the CUDA kernels run on Hopper GPUs only (compute capability "
        f"{supported}: H100, H200, GH200; they are built for sm_90a); cuda:{index} is "
        f"{_name(index)} with compute capability {major}.{minor}. Set "
        f"{_env.BACKEND}=reference to run the exact pure-torch references on this GPU "
        f"(slow, and nvfp4.moe's cannot be captured in a CUDA graph)."
    )
