"""``nvfp4::mxfp4_to_nvfp4`` and ``nvfp4::mxfp4_kernel_scales``: MXFP4 weights on the MoE
kernels, exactly, by a load-time rewrite of their scales (the codes are unchanged).

Two forms. :func:`mxfp4_to_nvfp4` converts the scales to NVFP4's (e4m3 per 16 k, 0.5625
bytes per weight), which every kernel reads. :func:`mxfp4_kernel_scales` keeps one UE8M0 byte
per 32 k (0.53 bytes per weight), rebased per row into the window the MoE's kernels decode
natively (:data:`nvfp4_ops.format.MXFP4_KERNEL_SCALE_BYTES`); ``nvfp4::moe`` takes either.

Why the conversion works at all: MXFP4 and NVFP4 share the e2m1 codes and their byte order,
and a UE8M0 scale is a power of two, which e4m3 holds exactly over 18 binades. With one fp32
global scale **per row** (the MoE and linear GEMMs already read global scales through per-row
views) every MXFP4 row of DeepSeek's checkpoints becomes NVFP4 whose dequantized values are
bitwise the MXFP4 ones; see the format module for the exact rule and for where the checkpoint
layout was confirmed (DeepSeek's ``inference/model.py`` and ``inference/convert.py``, vLLM's
``Mxfp4MoEMethod.create_weights``). The cost is the scale stream: 0.5625 bytes per weight
instead of 0.53125, which the kernels' own form keeps.

Both ops run in pure torch on any device (CPU and CUDA alike), like
``nvfp4::quantize``: it runs once per weight at load time. It works through the rows in chunks
(a few bytes of temporaries per 32-block), so V4-Pro's 384 experts x [6144, 3584] bytes need
no fp32 copy of the weights; it reads each chunk's verdict back to the host, so it must not be
captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from nvfp4_ops import format as fmt
from nvfp4_ops._library import qualname
from nvfp4_ops._validate import NVFP4InputError, expect_dtype, expect_same_device

__all__ = ["mxfp4_kernel_scales", "mxfp4_to_nvfp4"]

UE8M0_DTYPES = (torch.uint8, torch.float8_e8m0fnu)


def _check_meta(op: str, weight: torch.Tensor, scale: torch.Tensor) -> None:
    expect_dtype(op, "weight", weight, torch.uint8)
    expect_dtype(op, "scale", scale, *UE8M0_DTYPES)
    if weight.dim() == 0:
        raise NVFP4InputError(f"{op}: weight must be uint8 [..., K/2], got a scalar")
    k = weight.shape[-1] * 2
    want = (*weight.shape[:-1], k // fmt.MXFP4_BLOCK_SIZE)
    if k % fmt.MXFP4_BLOCK_SIZE or tuple(scale.shape) != want:
        raise NVFP4InputError(
            f"{op}: scale must have shape [..., K/32] = {want} for weight of shape "
            f"{tuple(weight.shape)} (K = {k}, K % 32 == 0), got {tuple(scale.shape)}")
    expect_same_device(op, {"weight": weight, "scale": scale})


def _run(op: str, convert, weight: torch.Tensor, scale: torch.Tensor):
    _check_meta(op, weight, scale)
    try:
        return convert(weight, scale)
    except ValueError as e:
        raise NVFP4InputError(f"nvfp4.{e}") from None


def _named(op, weight: torch.Tensor, scale: torch.Tensor, name: str):
    """``op(weight, scale)`` with ``name`` (the caller's name of the tensor) leading any error."""
    try:
        return op(weight, scale)
    except NVFP4InputError as e:
        raise NVFP4InputError(f"{name}: {e}") from None


@torch.library.custom_op(qualname("mxfp4_to_nvfp4"), mutates_args=())
def _mxfp4_to_nvfp4_op(weight: torch.Tensor, scale: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    return _run("nvfp4.mxfp4_to_nvfp4", fmt.mxfp4_to_nvfp4, weight, scale)


@_mxfp4_to_nvfp4_op.register_fake
def _(weight, scale):
    _check_meta("nvfp4.mxfp4_to_nvfp4", weight, scale)
    lead = tuple(weight.shape[:-1])
    k = weight.shape[-1] * 2
    return (weight.new_empty((*lead, k // fmt.BLOCK_SIZE), dtype=torch.float8_e4m3fn),
            weight.new_empty(lead, dtype=torch.float32))


def mxfp4_to_nvfp4(weight: torch.Tensor, scale: torch.Tensor, *, name: str = "weight"
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact NVFP4 scales of MXFP4 weights (``torch.ops.nvfp4.mxfp4_to_nvfp4``).

    The codes ``weight`` are used unchanged: ``(weight, block_scale, global_scale)`` is an
    NVFP4 weight with one global scale per row, and
    ``nvfp4_ops.dequantize(weight, block_scale, global_scale)`` is bitwise
    ``nvfp4_ops.format.mxfp4_dequantize(weight, scale)``.

    Per row: ``global_scale = 2^max(e_max - 8, -126)``, ``e_max`` the largest scale exponent
    (``byte - 127``) among the row's 32-blocks that hold a non-zero code; each block's e4m3
    scale is ``2^(e - log2(global_scale))`` on both of its 16-blocks; blocks of only +-0 codes
    get scale 0, a row of only such blocks ``global_scale = 1``.

    **Representable inputs**: no scale is 0xFF (NaN), and in every row each block holding a
    non-zero code has ``e >= e_max - 17``, i.e. the row's non-zero blocks span at most 18
    binades (the range of power-of-two e4m3 scales, ``2^-9 .. 2^8``). All-zero blocks are
    unconstrained. Anything else raises (no rounding ever happens).

    Args:
        weight: ``uint8 [..., K/2]`` MXFP4 codes (two e2m1 per byte, low nibble = even k),
            ``K % 32 == 0``; e.g. vLLM's ``w13_weight [E, 2I, H/2]``.
        scale: ``uint8`` or ``float8_e8m0fnu [..., K/32]`` UE8M0 scales, row-major, same
            device; e.g. ``w13_weight_scale [E, 2I, H/32]``.
        name: what the error messages call the tensor (e.g. the layer and parameter).

    Returns:
        ``(block_scale float8_e4m3fn [..., K/16], global_scale float32 [...])`` on the same
        device: the ``w13_scale`` / ``w13_global [E, 2I]`` (or ``w2_*``, ``[E, H]``) that
        :func:`nvfp4_ops.moe` takes.

    Raises:
        NVFP4InputError: wrong dtypes, shapes or devices; a NaN scale (its position); a row the
            representation cannot hold (the row index, the block, the exponents seen). Every
            message starts with ``name``.
    """
    return _named(torch.ops.nvfp4.mxfp4_to_nvfp4, weight, scale, name)


@torch.library.custom_op(qualname("mxfp4_kernel_scales"), mutates_args=())
def _mxfp4_kernel_scales_op(weight: torch.Tensor, scale: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    return _run("nvfp4.mxfp4_kernel_scales", fmt.mxfp4_kernel_scales, weight, scale)


@_mxfp4_kernel_scales_op.register_fake
def _(weight, scale):
    _check_meta("nvfp4.mxfp4_kernel_scales", weight, scale)
    return (scale.new_empty(scale.shape, dtype=torch.float8_e8m0fnu),
            weight.new_empty(tuple(weight.shape[:-1]), dtype=torch.float32))


def mxfp4_kernel_scales(weight: torch.Tensor, scale: torch.Tensor, *, name: str = "weight"
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 scales in the form the MoE's GPU kernels read natively
    (``torch.ops.nvfp4.mxfp4_kernel_scales``): one UE8M0 byte per 32 k, rebased per row into
    ``[9, 135]`` (``2^-118 .. 2^8``), and one fp32 global scale per row.

    The codes ``weight`` are used unchanged; ``nvfp4_ops.format.dequantize(weight,
    kernel_scale, global_scale)`` is bitwise ``nvfp4_ops.format.mxfp4_dequantize(weight,
    scale)``, and the GEMMs see the same bf16 weights as on the :func:`mxfp4_to_nvfp4` form
    (the same per-row rule: ``global_scale = 2^max(e_max - 8, -126)``). 0.53 bytes per weight
    instead of 0.5625.

    **Representable inputs**: no scale is 0xFF (NaN), and in every row each block holding a
    non-zero code has ``e >= e_max - 126`` (127 binades: every real checkpoint).

    Args:
        weight: ``uint8 [..., K/2]`` MXFP4 codes, ``K % 32 == 0``; e.g. vLLM's
            ``w13_weight [E, 2I, H/2]``.
        scale: ``uint8`` or ``float8_e8m0fnu [..., K/32]`` UE8M0 scales, same device.
        name: what the error messages call the tensor.

    Returns:
        ``(kernel_scale float8_e8m0fnu [..., K/32], global_scale float32 [...])``: the
        ``w13_scale`` / ``w13_global [E, 2I]`` (or ``w2_*``, ``[E, H]``) of
        :func:`nvfp4_ops.moe`.

    Raises:
        NVFP4InputError: as :func:`mxfp4_to_nvfp4` (every message starts with ``name``).
    """
    return _named(torch.ops.nvfp4.mxfp4_kernel_scales, weight, scale, name)
