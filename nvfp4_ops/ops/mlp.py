"""``nvfp4::mlp``: DeepSeek-V4's gated MLP (the shared expert) in NVFP4.

``out = down(silu(min(gate(x), L)) * clamp(up(x), -L, L))`` where gate and up are the two
halves of ``w13``, each with its own global scale.

CPU: the pure-torch reference (:func:`nvfp4_ops.reference.mlp_reference`).
CUDA: the kernel :func:`nvfp4_ops.kernels.cuda_kernel` returns for ``"mlp"``;
until one is registered, the same reference runs on the GPU.
"""

from __future__ import annotations

import torch

from nvfp4_ops import kernels
from nvfp4_ops._library import qualname
from nvfp4_ops._validate import check_global_scale_values, check_mlp_meta
from nvfp4_ops.reference import mlp_reference

__all__ = ["mlp"]


def _check(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global) -> None:
    check_mlp_meta(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global)
    check_global_scale_values("nvfp4.mlp", {"w13_global": w13_global, "w2_global": w2_global})


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
    _check(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global)
    return mlp_reference(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit,
                         wfrag=wfrag)


@_mlp_op.register_kernel("cuda")
def _(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit, wfrag=False):
    _check(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global)
    impl = kernels.cuda_kernel("mlp")
    if impl is None:
        return mlp_reference(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
                             swiglu_limit, wfrag=wfrag)
    return impl(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit,
                wfrag=wfrag)


@_mlp_op.register_fake
def _(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit, wfrag=False):
    check_mlp_meta(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global)
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

    Args:
        x: ``bf16 [M, H]``, ``H % 32 == 0``.
        w13: ``uint8 [2I, H/2]``: gate rows ``[0, I)`` then up rows ``[I, 2I)``; ``I % 32 == 0``.
        w13_scale: ``float8_e4m3fn [2I, H/16]`` (or its bytes as ``uint8``).
        w13_global: ``float32 [2]`` = (gate, up) global scales, applied separately, or
            ``[2I]``: one per row.
        w2: ``uint8 [H, I/2]``; w2_scale: ``float8_e4m3fn [H, I/16]`` (or its bytes as
            ``uint8``); w2_global: fp32 ``[]`` or ``[H]`` (one per row).
        swiglu_limit: ``L`` in ``silu(min(gate, L)) * clamp(up, -L, L)``; None for no clamp.
        wfrag: ``w13`` and ``w2`` were prepared by :func:`nvfp4_ops.to_wfrag_` (see
            :func:`nvfp4_ops.linear`).

    Returns:
        ``bf16 [M, H]``. The activation is rounded to bf16 before the down projection.

    Raises:
        NVFP4InputError: wrong dtype, shape, device or alignment; bad global scales.
    """
    return torch.ops.nvfp4.mlp(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
                               swiglu_limit, wfrag)
