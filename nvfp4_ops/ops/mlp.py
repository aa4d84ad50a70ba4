"""``nvfp4::mlp``: DeepSeek-V4's gated MLP (the shared expert) in NVFP4.

``out = down(silu(min(gate(x), L)) * clamp(up(x), -L, L))`` where gate and up are the two
halves of ``w13``, each with its own global scale.

CPU: the pure-torch reference (:func:`nvfp4_ops.reference.mlp_reference`).
CUDA: the kernel :func:`nvfp4_ops.kernels.cuda_kernel` returns for ``"mlp"`` (Hopper only,
:mod:`nvfp4_ops._device`); sizes its kernels do not cover run the reference on the GPU.

Per call only metadata and ``swiglu_limit`` are checked (:mod:`nvfp4_ops._validate`); the
weights' values are checked once at load with :func:`nvfp4_ops.check_mlp_weights`.
"""

from __future__ import annotations

import torch

from nvfp4_ops import _device, kernels
from nvfp4_ops._library import qualname
from nvfp4_ops._validate import (
    check_mlp_meta,
    check_swiglu_limit,
    check_weight_values,
    value_checks_enabled,
)
from nvfp4_ops.ops import _eager
from nvfp4_ops.reference import mlp_reference

__all__ = ["mlp"]


_OP = "nvfp4.mlp"


def _check_meta(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit) -> None:
    """Host-only checks (metadata, Python scalars): every call, op and fake."""
    check_mlp_meta(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global)
    check_swiglu_limit(_OP, swiglu_limit)


def _check(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit) -> None:
    _check_meta(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit)
    if value_checks_enabled(x):  # opt-in debugging: reads the scales (a host sync)
        check_weight_values(_OP, {"w13_scale": w13_scale, "w2_scale": w2_scale},
                            {"w13_global": w13_global, "w2_global": w2_global})


@torch.library.custom_op(qualname("mlp"), mutates_args=())
def _mlp_op(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_global: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_global: torch.Tensor,
    swiglu_limit: float | None,
    wfrag: bool = False,
) -> torch.Tensor:
    _check(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit)
    return mlp_reference(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit,
                         wfrag=wfrag)


#: launches of calls that repeat a checked one (same weights, same metadata; _eager.Repeats)
_repeats = _eager.Repeats()


@_mlp_op.register_kernel("cuda")
def _mlp_cuda(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit,
              wfrag=False):
    weights = (w13, w13_scale, w13_global, w2, w2_scale, w2_global)
    scalars = (swiglu_limit, wfrag)
    launch = _repeats.find((x,), weights, scalars)
    if launch is not None:  # repeats a call that passed every check below (same limit)
        return launch(x)
    _check(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit)
    _device.require_supported_gpu(x.device)
    prepare = kernels.cuda_kernel("mlp")
    launch = None if prepare is None else prepare(x, w13, w13_scale, w13_global, w2, w2_scale,
                                                  w2_global, swiglu_limit, wfrag=wfrag)
    if launch is None:  # the reference is forced, or no kernel covers these sizes
        return mlp_reference(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
                             swiglu_limit, wfrag=wfrag)
    _repeats.keep((x,), weights, scalars, launch)
    return launch(x)


@_mlp_op.register_fake
def _(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit, wfrag=False):
    _check_meta(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit)
    return x.new_empty(x.shape, dtype=torch.bfloat16)


def mlp(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_global: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_global: torch.Tensor,
    swiglu_limit: float | None = None,
    *,
    wfrag: bool = False,
) -> torch.Tensor:
    """NVFP4 gated MLP (``torch.ops.nvfp4.mlp``).

    Only metadata and ``swiglu_limit`` are checked per call. The scale values (block scales
    without NaN or negative entries, global scales finite and > 0) are not read per call:
    check them once with :func:`nvfp4_ops.check_mlp_weights` when the weights are loaded
    (``NVFP4_OPS_VALUE_CHECKS=1`` re-checks them on every eager call, for debugging).

    Args:
        x: ``bf16 [M, H]``, ``H % 32 == 0``.
        w13: ``uint8 [2I, H/2]``: gate rows ``[0, I)`` then up rows ``[I, 2I)``; ``I % 32 == 0``.
        w13_scale: ``float8_e4m3fn [2I, H/16]`` (or its bytes as ``uint8``).
        w13_global: ``float32 [2]`` = (gate, up) global scales, applied separately, or
            ``[2I]``: one per row.
        w2: ``uint8 [H, I/2]``; w2_scale: ``float8_e4m3fn [H, I/16]`` (or its bytes as
            ``uint8``); w2_global: fp32 ``[]`` or ``[H]`` (one per row).
        swiglu_limit: ``L`` in ``silu(min(gate, L)) * clamp(up, -L, L)``, ``> 0``; None (or
            ``inf``, the same result) for no clamp.
        wfrag: ``w13`` and ``w2`` were prepared by :func:`nvfp4_ops.to_wfrag_` (see
            :func:`nvfp4_ops.linear`).

    Returns:
        ``bf16 [M, H]``. The activation is rounded to bf16 before the down projection.

    Raises:
        NVFP4InputError: wrong dtype, shape, device or alignment; ``swiglu_limit`` NaN, 0 or
            negative; with ``NVFP4_OPS_VALUE_CHECKS=1`` also bad scale values.
        NVFP4UnsupportedGPUError: CUDA tensors on a GPU other than Hopper (see
            :mod:`nvfp4_ops._device`).
    """
    if _eager.direct(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global):
        # a plain eager CUDA call: skip the dispatcher's Python layers (same implementation)
        return _mlp_cuda(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit,
                         wfrag)
    return torch.ops.nvfp4.mlp(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
                               swiglu_limit, wfrag)
