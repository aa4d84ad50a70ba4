"""``nvfp4::quantize`` and ``nvfp4::dequantize``: the format of :mod:`nvfp4_ops.format` as ops.

Both run the pure-torch format code on any device (CPU and CUDA alike); there is no
dedicated CUDA kernel, since neither is on a hot path (weights are quantized offline). For the
same reason ``dequantize`` reads its scales to refuse bad values (one host sync on CUDA),
unlike the GEMM ops, whose weights are checked once at load.
"""

from __future__ import annotations

import torch

from nvfp4_ops import format as fmt
from nvfp4_ops._library import qualname
from nvfp4_ops._validate import (
    SCALE_DTYPES,
    NVFP4InputError,
    check_weight_values,
    expect_dtype,
    expect_same_device,
)

__all__ = ["quantize", "dequantize"]


def _check_quantize_meta(x: torch.Tensor, global_scale: torch.Tensor | None) -> None:
    op = "nvfp4.quantize"
    expect_dtype(op, "x", x, torch.bfloat16, torch.float16, torch.float32)
    if x.dim() == 0 or x.shape[-1] % fmt.BLOCK_SIZE:
        raise NVFP4InputError(
            f"{op}: x must be [..., K] with K % 16 == 0, got shape {tuple(x.shape)}"
        )
    if global_scale is not None:
        expect_dtype(op, "global_scale", global_scale, torch.float32)
        if global_scale.dim() != 0:
            raise NVFP4InputError(
                f"{op}: global_scale must be a scalar float32 tensor [], "
                f"got shape {tuple(global_scale.shape)}"
            )
        expect_same_device(op, {"x": x, "global_scale": global_scale})


@torch.library.custom_op(qualname("quantize"), mutates_args=())
def _quantize_op(
    x: torch.Tensor, global_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_quantize_meta(x, global_scale)
    try:
        packed, scale, gs = fmt.quantize(x, global_scale)
    except ValueError as e:
        raise NVFP4InputError(f"nvfp4.{e}") from None
    return packed, scale, gs.clone()


@_quantize_op.register_fake
def _(x, global_scale):
    _check_quantize_meta(x, global_scale)
    lead = tuple(x.shape[:-1])
    k = x.shape[-1]
    return (
        x.new_empty((*lead, k // 2), dtype=torch.uint8),
        x.new_empty((*lead, k // fmt.BLOCK_SIZE), dtype=torch.float8_e4m3fn),
        x.new_empty((), dtype=torch.float32),
    )


def _check_dequantize_meta(packed, block_scale, global_scale) -> None:
    op = "nvfp4.dequantize"
    expect_dtype(op, "packed", packed, torch.uint8)
    expect_dtype(op, "block_scale", block_scale, *SCALE_DTYPES)
    expect_dtype(op, "global_scale", global_scale, torch.float32)
    if packed.dim() == 0:
        raise NVFP4InputError(f"{op}: packed must be [..., K/2], got a scalar")
    want = (*packed.shape[:-1], packed.shape[-1] * 2 // fmt.BLOCK_SIZE)
    if (packed.shape[-1] * 2) % fmt.BLOCK_SIZE or tuple(block_scale.shape) != want:
        raise NVFP4InputError(
            f"{op}: block_scale must have shape [..., K/16] = {want} for packed "
            f"{tuple(packed.shape)} (K % 16 == 0), got {tuple(block_scale.shape)}"
        )
    lead = tuple(packed.shape[:-1])
    if global_scale.dim() != 0 and tuple(global_scale.shape) != lead:
        raise NVFP4InputError(
            f"{op}: global_scale must be [] or the leading shape {lead} (one per row), "
            f"got {tuple(global_scale.shape)}"
        )
    expect_same_device(op, {"packed": packed, "block_scale": block_scale,
                            "global_scale": global_scale})


@torch.library.custom_op(qualname("dequantize"), mutates_args=())
def _dequantize_op(
    packed: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor
) -> torch.Tensor:
    _check_dequantize_meta(packed, block_scale, global_scale)
    # not a hot path: the values are read here (the fake cannot, and skips this)
    check_weight_values("nvfp4.dequantize", {"block_scale": block_scale},
                        {"global_scale": global_scale})
    return fmt.dequantize(packed, block_scale, global_scale)


@_dequantize_op.register_fake
def _(packed, block_scale, global_scale):
    _check_dequantize_meta(packed, block_scale, global_scale)
    return packed.new_empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=torch.float32)


def quantize(
    x: torch.Tensor, global_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x`` to NVFP4 (``torch.ops.nvfp4.quantize``).

    Args:
        x: ``bf16/fp16/fp32 [..., K]``, ``K % 16 == 0``, finite.
        global_scale: optional fp32 ``[]`` on ``x``'s device, finite and > 0; default
            ``amax / (6 * 448)``.

    Returns:
        ``(packed uint8 [..., K/2], block_scale float8_e4m3fn [..., K/16], global_scale fp32 [])``.

    Raises:
        NVFP4InputError: wrong dtype or shape, ``global_scale`` on another device than ``x``,
            NaN/Inf in ``x``, or a bad ``global_scale``.
    """
    return torch.ops.nvfp4.quantize(x, global_scale)


def dequantize(
    packed: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor
) -> torch.Tensor:
    """Dequantize NVFP4 to fp32 (``torch.ops.nvfp4.dequantize``).

    Args:
        packed: ``uint8 [..., K/2]``.
        block_scale: ``float8_e4m3fn [..., K/16]`` (or its bytes as ``uint8``); no NaN,
            none negative.
        global_scale: fp32 ``[]`` or ``packed.shape[:-1]`` (one per row); finite and > 0.

    All three on one device. The scale values are read (one host sync on CUDA; not during
    CUDA-graph capture).

    Returns:
        ``float32 [..., K]`` = ``e2m1 * block_scale * global_scale``.

    Raises:
        NVFP4InputError: wrong dtypes, shapes or devices; a NaN or negative block scale; a
            global scale that is NaN, infinite, 0 or negative.
    """
    return torch.ops.nvfp4.dequantize(packed, block_scale, global_scale)
