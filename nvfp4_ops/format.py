"""The NVFP4 weight format (NVIDIA ModelOpt), in pure torch, exact, on any device.

Layout of one quantized matrix ``W[N, K]`` (``N`` output features, ``K`` the reduction dim):

======================  =================  ==============  ===================================
tensor                  dtype              shape           meaning
======================  =================  ==============  ===================================
``packed``              ``uint8``          ``[N, K/2]``    two e2m1 codes per byte
``block_scale``         ``float8_e4m3fn``  ``[N, K/16]``   one scale per 16 consecutive k
``global_scale``        ``float32``        ``[]``          ``weight_scale_2`` = amax / (6*448)
======================  =================  ==============  ===================================

Leading batch dims (experts) are allowed everywhere: ``[E, N, K/2]`` etc.

**Codes.** An e2m1 code is 4 bits: sign (bit 3), 2 exponent bits, 1 mantissa bit. Codes 0..7
are the magnitudes ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``; codes 8..15 are the same negated (code 8
is -0). **Byte order:** the low nibble holds the even element ``k = 2j``, the high nibble
``k = 2j + 1`` (the order of torch's ``float4_e2m1fn_x2``).

**Dequantization.** ``w[n, k] = e2m1[n, k] * f32(block_scale[n, k // 16]) * global_scale``.
The first product (:func:`decode`) has at most 2 + 4 significant bits, so it is exact in
bf16; kernels feed it to the tensor cores as bf16 and apply ``global_scale`` in fp32 after the
reduction. :func:`dequantize` returns the full product in fp32, rounded once.

**Quantization (the ModelOpt recipe, with every edge case pinned down):**

1. ``global = amax / (6 * 448)`` in fp32. An all-zero tensor (amax 0) gets ``global = 1``:
   the codes and scales are then all zero and any positive global scale is valid.
2. Per block of 16: ``block_scale = e4m3(min(block_amax / (6 * global), 448))``, cast with
   round-to-nearest-even. It may round to an e4m3 subnormal or to zero.
3. Per value: ``q = rne_e2m1(x / (f32(block_scale) * global))``, saturating at +-6, ties to
   the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). A
   block whose scale is zero (all-zero block, or one whose scale underflowed e4m3) stores all
   codes 0, so it dequantizes to exact zeros instead of dividing by zero.
4. NaN or Inf anywhere in the input raises :class:`ValueError`.
"""

from __future__ import annotations

import torch

__all__ = [
    "BLOCK_SIZE",
    "E2M1_MAX",
    "E4M3_MAX",
    "E2M1_VALUES",
    "as_e4m3",
    "pack_e2m1",
    "unpack_e2m1",
    "e2m1_to_float",
    "float_to_e2m1",
    "decode",
    "dequantize",
    "quantize",
    "global_scale_from_amax",
    "block_scales",
]

BLOCK_SIZE = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0

#: Value of each of the 16 e2m1 codes, indexed by code.
E2M1_VALUES: tuple[float, ...] = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)  # fmt: skip

# Rounding boundaries between consecutive magnitudes. At the boundaries listed in
# _TIES_UP the even neighbour is the upper one, so the tie rounds up; at the others it rounds
# down (see step 3 of the module docstring).
_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIES_UP = (False, True, False, True, False, True, False)


def _lut(device: torch.device) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes two per byte.

    Args:
        codes: ``uint8 [..., K]`` with values in 0..15, ``K`` even.

    Returns:
        ``uint8 [..., K/2]``; byte ``j`` holds ``codes[..., 2j]`` in its low nibble and
        ``codes[..., 2j+1]`` in its high nibble.
    """
    if codes.dtype != torch.uint8:
        raise TypeError(f"pack_e2m1: codes must be uint8, got {codes.dtype}")
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_e2m1: last dim must be even, got shape {tuple(codes.shape)}")
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pairs[..., 0] & 0xF) | ((pairs[..., 1] & 0xF) << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_e2m1`: ``uint8 [..., K/2]`` -> codes ``uint8 [..., K]``."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_e2m1: packed must be uint8, got {packed.dtype}")
    low = packed & 0xF
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Codes ``uint8 [...]`` (0..15) -> their values, ``float32 [...]`` (exact)."""
    return _lut(codes.device)[codes.long()]


def float_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round ``x`` (already divided by its scales) to the nearest e2m1 code.

    Round-to-nearest-even on the magnitude, saturating at 6; negative inputs (including
    ones that round to zero) get the sign bit, as ModelOpt does.

    Args:
        x: floating tensor of any shape; must be finite.

    Returns:
        ``uint8`` codes, same shape.
    """
    x = x.float()
    mag = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for bound, tie_up in zip(_BOUNDS, _TIES_UP, strict=True):
        code += (mag >= bound) if tie_up else (mag > bound)
    return code | ((x < 0).to(torch.uint8) << 3)


def as_e4m3(block_scale: torch.Tensor) -> torch.Tensor:
    """Block scales as ``float8_e4m3fn``: uint8 raw bytes are reinterpreted, not converted."""
    if block_scale.dtype == torch.uint8:
        return block_scale.view(torch.float8_e4m3fn)
    return block_scale


def _check_blocks(packed: torch.Tensor, block_scale: torch.Tensor, fn: str) -> None:
    if packed.dtype != torch.uint8:
        raise TypeError(f"{fn}: packed must be uint8 [..., K/2], got dtype {packed.dtype}")
    if block_scale.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(
            f"{fn}: block_scale must be float8_e4m3fn (or its bytes as uint8) [..., K/16], "
            f"got dtype {block_scale.dtype}"
        )
    k = packed.shape[-1] * 2
    want = (*packed.shape[:-1], k // BLOCK_SIZE)
    if k % BLOCK_SIZE or tuple(block_scale.shape) != want:
        raise ValueError(
            f"{fn}: block_scale must have shape {want} for packed of shape "
            f"{tuple(packed.shape)} (K={k}, K % 16 == 0), got {tuple(block_scale.shape)}"
        )


def decode(packed: torch.Tensor, block_scale: torch.Tensor) -> torch.Tensor:
    """``e2m1 * block_scale`` without the global scale: exact, and exactly representable in bf16.

    Args:
        packed: ``uint8 [..., K/2]``.
        block_scale: ``float8_e4m3fn [..., K/16]`` (or its raw bytes as ``uint8``).

    Returns:
        ``float32 [..., K]``.
    """
    _check_blocks(packed, block_scale, "decode")
    block_scale = as_e4m3(block_scale)
    values = e2m1_to_float(unpack_e2m1(packed))
    scale = block_scale.float().repeat_interleave(BLOCK_SIZE, dim=-1)
    return values * scale


def dequantize(
    packed: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor
) -> torch.Tensor:
    """Full dequantization ``e2m1 * f32(block_scale) * global_scale``, in fp32.

    Args:
        packed: ``uint8 [..., K/2]``.
        block_scale: ``float8_e4m3fn [..., K/16]``.
        global_scale: ``float32``, shape ``[]`` or the leading shape ``packed.shape[:-1]``
            (one scale per row), or anything that broadcasts against ``[..., 1]``.

    Returns:
        ``float32 [..., K]``; each element is rounded once (the ``decode`` product is exact).
    """
    gs = global_scale.float()
    if gs.dim() > 0:
        gs = gs.unsqueeze(-1)
    return decode(packed, block_scale) * gs


def global_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """``amax / (6 * 448)`` in fp32, or 1.0 where ``amax`` is zero (see module docstring)."""
    amax = amax.float()
    return torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))


def block_scales(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """e4m3 block scales of ``x [..., K]`` for a given fp32 ``global_scale`` (``[]``)."""
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    block_amax = blocks.abs().amax(dim=-1)
    raw = block_amax / (E2M1_MAX * global_scale.float())
    # Clamp: fp32 rounding can put the largest block a hair above 448, and torch's e4m3 cast
    # turns values past the top of the range into NaN instead of saturating.
    return raw.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)


def quantize(
    x: torch.Tensor, global_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x`` to NVFP4 with one global scale for the whole tensor.

    Args:
        x: ``bfloat16``/``float16``/``float32 [..., K]``, ``K % 16 == 0``, finite.
        global_scale: optional ``float32 []`` to use instead of ``amax / (6 * 448)`` (for
            example to give the shards of a fused projection one shared scale). Must be
            finite and positive. Values beyond ``6 * 448 * global_scale`` saturate.

    Returns:
        ``(packed uint8 [..., K/2], block_scale float8_e4m3fn [..., K/16], global_scale
        float32 [])``.

    Raises:
        ValueError: non-finite input, ``K % 16 != 0``, or a bad ``global_scale``.
    """
    if not x.is_floating_point():
        raise TypeError(f"quantize: x must be a floating tensor [..., K], got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] % BLOCK_SIZE:
        raise ValueError(f"quantize: x must be [..., K] with K % 16 == 0, got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("quantize: x contains NaN or Inf; NVFP4 cannot represent them")
    if global_scale is None:
        global_scale = global_scale_from_amax(x.abs().amax() if x.numel() else x.new_zeros(()))
    else:
        if global_scale.numel() != 1 or global_scale.dim() != 0:
            raise ValueError(
                f"quantize: global_scale must be a float32 scalar tensor [], "
                f"got shape {tuple(global_scale.shape)}"
            )
        global_scale = global_scale.float().to(x.device)
        if not bool(torch.isfinite(global_scale)) or not bool(global_scale > 0):
            raise ValueError(f"quantize: global_scale must be finite and > 0, got {global_scale}")
    scale = block_scales(x, global_scale)
    divisor = scale.float() * global_scale
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    safe = torch.where(divisor > 0, divisor, torch.ones_like(divisor)).unsqueeze(-1)
    codes = float_to_e2m1(blocks / safe)
    codes = torch.where((divisor > 0).unsqueeze(-1), codes, torch.zeros_like(codes))
    packed = pack_e2m1(codes.reshape(x.shape))
    return packed, scale, global_scale.reshape(())
