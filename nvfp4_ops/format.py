"""The NVFP4 weight format (NVIDIA ModelOpt) and MXFP4 (OCP MX): pure torch, exact, any device.

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
   the codes and scales are then all zero and any positive global scale is valid. A non-zero
   tensor whose global scale would fall below fp32's normal range (``amax < 6 * 448 * 2^-126``,
   about 3.2e-35) is refused: such a global scale loses bits, underflows to 0 for
   ``amax`` below about 3.8e-42, and kernels that flush subnormals to zero would zero the layer.
2. Per block of 16: ``block_scale = e4m3(min(block_amax / (6 * global), 448))``, cast with
   round-to-nearest-even. It may round to an e4m3 subnormal or to zero.
3. Per value: ``q = rne_e2m1(x / (f32(block_scale) * global))``, saturating at +-6, ties to
   the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). A
   block whose scale is zero (all-zero block, or one whose scale underflowed e4m3) stores all
   codes 0, so it dequantizes to exact zeros instead of dividing by zero.
4. NaN or Inf anywhere in the input raises :class:`ValueError`.

MXFP4 (OCP Microscaling, the routed experts of DeepSeek's own DeepSeek-V4 checkpoints)
-------------------------------------------------------------------------------------

======================  =================  ==============  ===================================
tensor                  dtype              shape           meaning
======================  =================  ==============  ===================================
``packed``              ``uint8``          ``[N, K/2]``    two e2m1 codes per byte (as NVFP4)
``scale``               ``uint8``          ``[N, K/32]``   UE8M0: one power of two per 32 k
======================  =================  ==============  ===================================

The codes and their byte order are NVFP4's (low nibble = even ``k``). Each run of 32
consecutive ``k`` has one UE8M0 scale byte ``b`` with value ``2^(b - 127)``: ``0x00`` is
``2^-127``, ``0x7F`` is 1, ``0xFE`` is ``2^127`` and ``0xFF`` is NaN (refused). There is no
global scale: ``w[n, k] = e2m1[n, k] * 2^(scale[n, k // 32] - 127)``, exact in fp32 except where
it overflows (only for ``b = 0xFE`` and ``|e2m1| >= 2``). Scales may also come as
``torch.float8_e8m0fnu`` (the same byte, the dtype of the checkpoint files).

Checkpoint layout, as DeepSeek's reference inference code and vLLM 0.33 read it: the release
stores each routed expert's ``layers.L.ffn.experts.E.{w1,w2,w3}.weight`` as ``int8 [N, K/2]``
and its ``...scale`` as ``float8_e8m0fnu [N, K/32]``, row-major, ``N`` output features, ``K``
the reduction dim. DeepSeek's ``inference/model.py`` declares the FP4 ``Linear`` with a
``float4_e2m1fn_x2 [out, in/2]`` weight and a ``float8_e8m0fnu [out, in/32]`` scale ("one scale
per 32 fp4 elements along K"); its ``inference/convert.py`` reinterprets the int8 bytes as
``float4_e2m1fn_x2``, and its lossless FP4 -> FP8 cast (``cast_e2m1fn_to_e4m3fn``) unpacks
the low nibble as the even element. vLLM's ``Mxfp4MoEMethod.create_weights``
(``quantization/mxfp4.py``) holds them as ``uint8 [E, 2I, H/2]`` / ``[E, H, I/2]`` codes and
``uint8 [E, 2I, H/32]`` / ``[E, H, I/32]`` scale bytes (its scale loader views e8m0 as
uint8), and its MXFP4 quantizer (``utils/mxfp4_utils.py``) packs ``evens | odds << 4``.

:func:`mxfp4_quantize` follows the OCP MX v1.0 recipe: per block of 32, the shared exponent is
``floor(log2(amax)) - 2`` (2 = the largest e2m1 exponent), clamped to ``[-127, 127]``; each
element is ``x / 2^shared`` rounded to nearest-even e2m1 and saturated at +-6 (the rounding of
:func:`float_to_e2m1`); an all-zero block gets scale byte 0 and zero codes; NaN/Inf raise.

:func:`mxfp4_to_nvfp4` converts the scales to NVFP4 **exactly** (the codes are unchanged):
per row, ``global = 2^max(e_max - 8, -126)`` and each block's e4m3 scale is
``2^(e - log2(global))``, written to both of its 16-blocks. A power of two ``2^j`` is exact in
e4m3 for ``j`` in ``[-9, 8]``, so a row converts exactly iff every block whose codes are not
all zero has ``e >= e_max - 17`` (18 binades per row; the clamp at -126, which keeps the
global scales normal fp32 numbers, changes nothing here since ``e >= -127`` always). Blocks
whose codes are all (+-)zero take scale 0; a row of only such blocks takes ``global = 1``.

**The kernels' form** (:func:`mxfp4_kernel_scales`): the MoE's GPU kernels also read MXFP4
natively, one UE8M0 byte per 32 k (0.53 bytes per weight instead of 0.5625), and an fp32
global scale per row like NVFP4's. They turn a byte ``b`` into a bf16 factor whose exponent
field is ``b + 119``, which is exact for ``b`` in ``[9, 135]`` (:data:`MXFP4_KERNEL_SCALE_BYTES`,
scales ``2^-118 .. 2^8``). The load-time rebase moves each row's exponents into that window
with the rule of the conversion above (``global = 2^max(e_max - 8, -126)``), which any row
whose non-zero blocks span at most 127 binades allows; the weights are then bitwise those of
the checkpoint, and the bf16 values the tensor cores see equal the converted form's. In this
form ``decode`` and ``dequantize`` take ``float8_e8m0fnu [..., K/32]`` scales.
:func:`mxfp4_group_globals` then shares one global scale among a group of rows (a MoE expert's
gate or up half) wherever the window still holds every row of the group.
"""

from __future__ import annotations

import math

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
    "MXFP4_BLOCK_SIZE",
    "UE8M0_BIAS",
    "UE8M0_NAN",
    "as_ue8m0_bytes",
    "ue8m0_to_float",
    "mxfp4_dequantize",
    "mxfp4_quantize",
    "mxfp4_to_nvfp4",
    "MXFP4_KERNEL_SCALE_BYTES",
    "mxfp4_kernel_scales",
    "mxfp4_group_globals",
]

BLOCK_SIZE = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
_F32_TINY = torch.finfo(torch.float32).tiny  # 2^-126, the smallest normal fp32

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
        block_scale: ``float8_e4m3fn [..., K/16]`` (or its raw bytes as ``uint8``), or
            ``float8_e8m0fnu [..., K/32]``: UE8M0 scales of the kernels' MXFP4 form (module
            docstring; exact in bf16 for bytes in :data:`MXFP4_KERNEL_SCALE_BYTES`).

    Returns:
        ``float32 [..., K]``.
    """
    if block_scale.dtype == torch.float8_e8m0fnu:
        return mxfp4_dequantize(packed, block_scale)
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
        block_scale: ``float8_e4m3fn [..., K/16]``, or ``float8_e8m0fnu [..., K/32]``
            (:func:`decode`).
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
        ValueError: non-finite input, ``K % 16 != 0``, a bad ``global_scale``, or (without
            ``global_scale``) a non-zero ``x`` with ``amax < 6 * 448 * 2^-126`` (about
            3.2e-35), whose global scale would not be a normal fp32 number.
    """
    if not x.is_floating_point():
        raise TypeError(f"quantize: x must be a floating tensor [..., K], got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] % BLOCK_SIZE:
        raise ValueError(f"quantize: x must be [..., K] with K % 16 == 0, got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("quantize: x contains NaN or Inf; NVFP4 cannot represent them")
    if global_scale is None:
        amax = x.abs().amax().float() if x.numel() else x.new_zeros((), dtype=torch.float32)
        global_scale = global_scale_from_amax(amax)
        if bool((amax > 0) & (global_scale < _F32_TINY)):
            raise ValueError(
                f"quantize: x is too small for NVFP4: amax {amax.item():.3e} gives the global "
                f"scale amax / (6 * 448) = {global_scale.item():.3e}, below fp32's normal range "
                f"({_F32_TINY:.3e}), where it loses precision or underflows to 0; x must be all "
                f"zero or have amax >= {6 * 448 * _F32_TINY:.3e} (scale it up)")
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


# ---------------------------------------------------------------------------------- MXFP4

MXFP4_BLOCK_SIZE = 32
UE8M0_BIAS = 127
UE8M0_NAN = 0xFF

# e4m3 scales can hold 2^j exactly for j in [-9, 8]: normals 2^-6..2^8, subnormals 2^-9..2^-7.
_E4M3_POW2_MIN, _E4M3_POW2_MAX = -9, 8
#: UE8M0 scale bytes the MoE's GPU kernels decode exactly (``2^-118 .. 2^8``: module docstring,
#: "The kernels' form")
MXFP4_KERNEL_SCALE_BYTES = (9, 135)
_F32_MIN_NORMAL_EXP = -126
# A block whose 16 code bytes, masked to the magnitude bits of both nibbles, are all zero holds
# only +-0 (codes 0 and 8); its scale does not matter.
_MAGNITUDE_BITS_U64 = 0x7777_7777_7777_7777
# Rows per chunk of the conversion are sized to about this many 32-blocks, bounding its
# temporaries (a few bytes per block) whatever the tensor size.
_CONVERT_CHUNK_BLOCKS = 1 << 22


def as_ue8m0_bytes(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 scales as their raw bytes: ``uint8`` is returned as is, ``float8_e8m0fnu`` is
    reinterpreted (same memory), anything else raises :class:`TypeError`."""
    if scale.dtype == torch.uint8:
        return scale
    if scale.dtype == torch.float8_e8m0fnu:
        return scale.view(torch.uint8)
    got = str(scale.dtype).removeprefix("torch.")
    raise TypeError(f"UE8M0 scales must be uint8 or float8_e8m0fnu, got {got}")


def _first_nan_scale(sbytes: torch.Tensor, where: str) -> None:
    nan = sbytes == UE8M0_NAN
    if bool(nan.any()):
        pos = tuple(nan.nonzero()[0].tolist())
        raise ValueError(
            f"{where}: scale{list(pos)} is 0xFF, the UE8M0 NaN code ({int(nan.sum())} of "
            f"{nan.numel()} scales are NaN); MXFP4 weights must have finite scales")


def ue8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 scale bytes -> their values ``2^(b - 127)`` as ``float32``, exactly.

    Built from the fp32 bit pattern (``b << 23``; ``b = 0`` is the subnormal ``2^-127``), so the
    result is exact on every device whatever ``exp2`` does with subnormals.

    Args:
        scale: ``uint8`` or ``float8_e8m0fnu``, any shape.

    Returns:
        ``float32``, same shape.

    Raises:
        TypeError: another dtype.
        ValueError: a NaN code (0xFF); the message gives the first position and the count.
    """
    sbytes = as_ue8m0_bytes(scale)
    _first_nan_scale(sbytes, "ue8m0_to_float")
    bits = sbytes.to(torch.int32) << 23
    bits = torch.where(sbytes == 0, torch.full_like(bits, 1 << 22), bits)  # 2^-127
    return bits.view(torch.float32)


def _check_mx_blocks(packed: torch.Tensor, scale: torch.Tensor, fn: str) -> None:
    if packed.dtype != torch.uint8:
        raise TypeError(f"{fn}: packed must be uint8 [..., K/2], got dtype {packed.dtype}")
    if scale.dtype not in (torch.uint8, torch.float8_e8m0fnu):
        raise TypeError(
            f"{fn}: scale must be uint8 or float8_e8m0fnu [..., K/32], got dtype {scale.dtype}")
    if packed.dim() == 0:
        raise ValueError(f"{fn}: packed must be [..., K/2], got a scalar")
    k = packed.shape[-1] * 2
    want = (*packed.shape[:-1], k // MXFP4_BLOCK_SIZE)
    if k % MXFP4_BLOCK_SIZE or tuple(scale.shape) != want:
        raise ValueError(
            f"{fn}: scale must have shape [..., K/32] = {want} for packed of shape "
            f"{tuple(packed.shape)} (K = {k}, K % 32 == 0), got {tuple(scale.shape)}")
    if packed.device != scale.device:
        raise ValueError(
            f"{fn}: packed is on {packed.device} but scale is on {scale.device}")


def mxfp4_dequantize(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """MXFP4 -> ``float32``: ``e2m1 * 2^(scale - 127)`` (the codes unpacked as NVFP4's).

    Args:
        packed: ``uint8 [..., K/2]``, ``K % 32 == 0``.
        scale: ``uint8`` or ``float8_e8m0fnu [..., K/32]``, same device.

    Returns:
        ``float32 [..., K]``, exact (a value overflows to +-inf only for scale 0xFE and
        ``|e2m1| >= 2``, which fp32 cannot hold).

    Raises:
        TypeError / ValueError: dtypes, shapes or devices; a NaN scale (0xFF).
    """
    _check_mx_blocks(packed, scale, "mxfp4_dequantize")
    values = e2m1_to_float(unpack_e2m1(packed))
    return values * ue8m0_to_float(scale).repeat_interleave(MXFP4_BLOCK_SIZE, dim=-1)


def mxfp4_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` to MXFP4 by the OCP MX recipe (module docstring).

    Args:
        x: ``bfloat16``/``float16``/``float32 [..., K]``, ``K % 32 == 0``, finite.

    Returns:
        ``(packed uint8 [..., K/2], scale uint8 [..., K/32])`` (scale bytes, UE8M0).

    Raises:
        TypeError: ``x`` is not floating.
        ValueError: ``K % 32 != 0`` or NaN/Inf in ``x``.
    """
    if not x.is_floating_point():
        raise TypeError(f"mxfp4_quantize: x must be a floating tensor [..., K], got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] % MXFP4_BLOCK_SIZE:
        raise ValueError(
            f"mxfp4_quantize: x must be [..., K] with K % 32 == 0, got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("mxfp4_quantize: x contains NaN or Inf; MXFP4 cannot represent them")
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // MXFP4_BLOCK_SIZE, MXFP4_BLOCK_SIZE)
    amax = blocks.abs().amax(dim=-1)
    # frexp: amax = m * 2^p with m in [0.5, 1), so floor(log2(amax)) = p - 1, exactly
    # (also for subnormals); the largest e2m1 magnitude is 1.5 * 2^2, hence the "- 2".
    _, p = torch.frexp(amax)
    shared = (p.to(torch.int32) - 1 - 2).clamp(-UE8M0_BIAS, UE8M0_BIAS)
    shared = torch.where(amax > 0, shared, torch.full_like(shared, -UE8M0_BIAS))
    # x * 2^-shared is exact (a power-of-two rescale) unless it underflows, and then the
    # value rounds to code 0 either way; 2^-shared is built from its bits, never by pow/exp2.
    inverse = ue8m0_to_float((UE8M0_BIAS - shared).to(torch.uint8))
    scaled = blocks * inverse.unsqueeze(-1)
    codes = float_to_e2m1(scaled).reshape(x.shape)
    return pack_e2m1(codes), (shared + UE8M0_BIAS).to(torch.uint8)


def _e4m3_pow2_bytes(j: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes of ``2^j`` for integer ``j`` in ``[-9, 8]``: normals are exponent field
    ``j + 7`` with a zero mantissa, ``2^-7..2^-9`` are the subnormals ``m * 2^-9``."""
    j = j.clamp(_E4M3_POW2_MIN, _E4M3_POW2_MAX).to(torch.int32)
    normal = (j + 7) << 3
    subnormal = torch.ones_like(j) << (j + 9).clamp(min=0)
    return torch.where(j >= -6, normal, subnormal).to(torch.uint8)


def _nonzero_blocks(codes: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """``codes uint8 [R, K/2]`` -> bool ``[R, K/32]``: the 32-block has a non-zero value."""
    rows = codes.shape[0]
    try:  # 8 bytes per op; needs an 8-byte-aligned storage offset
        words = codes.view(torch.int64).view(rows, num_blocks, 2)
        return (words & _MAGNITUDE_BITS_U64).ne(0).any(dim=-1)
    except RuntimeError:
        return (codes.view(rows, num_blocks, 16) & 0x77).ne(0).any(dim=-1)


def _mx_rows(packed: torch.Tensor, scale: torch.Tensor, fn: str, j_min: int, form: str):
    """The row analysis both scale conversions share: for each chunk of rows (about
    :data:`_CONVERT_CHUNK_BLOCKS` blocks), yields ``(r0, r1, s, nz, e, log2_global)``: the
    chunk's rows, their UE8M0 bytes ``s``, which blocks hold a non-zero code ``nz``, the block
    exponents ``e = s - 127`` and each row's ``log2(global) = max(e_max - 8, -126)`` (0 for a
    row of only zero blocks), after checking that no scale is NaN and that every non-zero
    block has ``e - log2(global) >= j_min`` (the target's smallest power of two; its largest
    is ``2^8`` for both). One host sync per chunk.

    Raises:
        ValueError: a NaN scale (its position and the count), or a row ``form`` cannot hold
            (the row index, the block, the exponents seen).
    """
    lead = tuple(packed.shape[:-1])
    num_blocks = scale.shape[-1]
    codes = packed.reshape(math.prod(lead), packed.shape[-1])
    sbytes = as_ue8m0_bytes(scale).reshape(math.prod(lead), num_blocks)
    rows = math.prod(lead) if num_blocks else 0  # K = 0: nothing to scale
    step = max(1, _CONVERT_CHUNK_BLOCKS // max(num_blocks, 1))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        s = sbytes[r0:r1]
        nz = _nonzero_blocks(codes[r0:r1], num_blocks)
        e = s.to(torch.int16) - UE8M0_BIAS
        e_max = torch.where(nz, e, torch.full_like(e, -1000)).amax(dim=-1)
        e_min = torch.where(nz, e, torch.full_like(e, 1000)).amin(dim=-1)
        has = nz.any(dim=-1)
        log2_global = torch.where(has, (e_max - 8).clamp(min=_F32_MIN_NORMAL_EXP),
                                  torch.zeros_like(e_max))
        bad = has & (e_min < log2_global + j_min)
        nan = s == UE8M0_NAN
        if bool(torch.stack([nan.any(), bad.any()]).any()):  # one host sync per chunk
            if bool(nan.any()):
                i, j = nan.nonzero()[0].tolist()
                pos = (*_unravel(r0 + i, lead), j)
                raise ValueError(
                    f"{fn}: scale{list(pos)} is 0xFF, the UE8M0 NaN code "
                    f"({int(nan.sum())} NaN scales in rows {r0}..{r1 - 1} of {rows}); MXFP4 "
                    "weights must have finite scales")
            i = int(bad.nonzero()[0, 0])
            row_e = e[i].tolist()
            row_nz = nz[i].tolist()
            lo = int(log2_global[i]) + j_min
            j = next(b for b, (x, z) in enumerate(zip(row_e, row_nz, strict=True))
                     if z and x < lo)
            j_max = next(b for b, (x, z) in enumerate(zip(row_e, row_nz, strict=True))
                         if z and x == int(e_max[i]))
            raise ValueError(
                f"{fn}: row {list(_unravel(r0 + i, lead))} cannot be held exactly by {form} "
                f"with one fp32 global scale per row: block {j} (k {32 * j}..{32 * j + 31}) "
                f"has scale exponent {row_e[j]} but block {j_max} has {int(e_max[i])}; its "
                f"block scales reach {8 - j_min + 1} binades, [{lo}, {lo + 8 - j_min}] here, "
                f"and this row's non-zero blocks span exponents {int(e_min[i])}.."
                f"{int(e_max[i])} ({int(bad.sum())} such rows in rows {r0}..{r1 - 1} of "
                f"{rows})")
        yield r0, r1, s, nz, e, log2_global


def _global_of(log2_global: torch.Tensor) -> torch.Tensor:
    """fp32 ``2^j`` from its bits (``j`` in ``[-126, 127]``), never by pow/exp2."""
    return ((log2_global.to(torch.int32) + UE8M0_BIAS) << 23).view(torch.float32)


def mxfp4_to_nvfp4(packed: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact NVFP4 scales of MXFP4 weights (the codes ``packed`` stay as they are).

    For each row (the last dim is ``k``): ``global = 2^max(e_max - 8, -126)`` with ``e_max``
    the largest block exponent among the row's blocks that hold a non-zero code, and block
    scale ``2^(e - log2(global))`` (e4m3) for each 32-block, written to both of its 16-blocks;
    blocks of only +-0 codes get scale 0, rows of only such blocks ``global = 1``. Then
    ``dequantize(packed, block_scale, global)`` equals ``mxfp4_dequantize(packed, scale)``
    bitwise.

    **Representable inputs:** every scale finite (not 0xFF), and in every row every block that
    holds a non-zero code has ``e >= e_max - 17``: the row's non-zero blocks span at most 18
    binades. All-zero blocks are unconstrained.

    Runs in chunks of rows (a few bytes of temporaries per 32-block, about ``2^22`` blocks per
    chunk) on the inputs' device, and reads each chunk's verdict back (a host sync per
    chunk), so it is a load-time step, not for CUDA-graph capture.

    Args:
        packed: ``uint8 [..., K/2]`` codes, ``K % 32 == 0`` (read to find all-zero blocks).
        scale: ``uint8`` or ``float8_e8m0fnu [..., K/32]`` UE8M0 scales, same device.

    Returns:
        ``(block_scale float8_e4m3fn [..., K/16], global_scale float32 [...])``, contiguous.

    Raises:
        TypeError / ValueError: dtypes, shapes or devices; a NaN scale (position and count);
            a row it cannot hold exactly (the row index, the block, the exponents seen).
    """
    _check_mx_blocks(packed, scale, "mxfp4_to_nvfp4")
    lead, num_blocks = tuple(packed.shape[:-1]), scale.shape[-1]
    block_out = torch.zeros(math.prod(lead), 2 * num_blocks, dtype=torch.uint8,
                            device=packed.device)
    global_out = torch.ones(math.prod(lead), dtype=torch.float32, device=packed.device)
    for r0, r1, s, nz, e, log2_global in _mx_rows(packed, scale, "mxfp4_to_nvfp4",
                                                  _E4M3_POW2_MIN, "NVFP4"):
        block = torch.where(nz, _e4m3_pow2_bytes(e - log2_global.unsqueeze(-1)),
                            torch.zeros_like(s))
        block_out[r0:r1] = block.repeat_interleave(2, dim=-1)
        global_out[r0:r1] = _global_of(log2_global)
    return (block_out.view(torch.float8_e4m3fn).reshape(*lead, 2 * num_blocks),
            global_out.reshape(lead))


def mxfp4_kernel_scales(packed: torch.Tensor, scale: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 scales in the form the MoE's GPU kernels decode natively (one UE8M0 byte per 32 k
    inside :data:`MXFP4_KERNEL_SCALE_BYTES`, module docstring), exactly; the codes ``packed``
    stay as they are.

    Per row, as :func:`mxfp4_to_nvfp4`: ``global = 2^max(e_max - 8, -126)``, and each block's
    scale becomes ``2^(e - log2(global))`` (a UE8M0 byte of at most 135); blocks of only +-0
    codes take 1.0 (byte 127), rows of only such blocks ``global = 1``. Then
    ``dequantize(packed, kernel_scale, global)`` equals ``mxfp4_dequantize(packed, scale)``
    bitwise, and the GEMMs see the same bf16 weights as on the :func:`mxfp4_to_nvfp4` form.

    **Representable inputs:** every scale finite, and in every row every non-zero block has
    ``e >= e_max - 126`` (127 binades per row: every real checkpoint).

    Args:
        packed: ``uint8 [..., K/2]`` codes, ``K % 32 == 0`` (read to find all-zero blocks).
        scale: ``uint8`` or ``float8_e8m0fnu [..., K/32]`` UE8M0 scales, same device.

    Returns:
        ``(kernel_scale float8_e8m0fnu [..., K/32], global_scale float32 [...])``, contiguous:
        the ``w13_scale`` / ``w13_global [E, 2I]`` (or ``w2_*``) of :func:`nvfp4_ops.moe`.
        A load-time step (a host sync per chunk of rows), as :func:`mxfp4_to_nvfp4`.

    Raises:
        TypeError / ValueError: dtypes, shapes or devices; a NaN scale (position and count);
            a row it cannot hold exactly (the row index, the block, the exponents seen).
    """
    _check_mx_blocks(packed, scale, "mxfp4_kernel_scales")
    lead, num_blocks = tuple(packed.shape[:-1]), scale.shape[-1]
    lowest = MXFP4_KERNEL_SCALE_BYTES[0] - UE8M0_BIAS
    scale_out = torch.full((math.prod(lead), num_blocks), UE8M0_BIAS, dtype=torch.uint8,
                           device=packed.device)
    global_out = torch.ones(math.prod(lead), dtype=torch.float32, device=packed.device)
    for r0, r1, s, nz, e, log2_global in _mx_rows(packed, scale, "mxfp4_kernel_scales",
                                                  lowest, "the MoE kernels' UE8M0 scales"):
        rebased = (e - log2_global.unsqueeze(-1) + UE8M0_BIAS).clamp(0, 254).to(torch.uint8)
        scale_out[r0:r1] = torch.where(nz, rebased, torch.full_like(s, UE8M0_BIAS))
        global_out[r0:r1] = _global_of(log2_global)
    return (scale_out.view(torch.float8_e8m0fnu).reshape(*lead, num_blocks),
            global_out.reshape(lead))


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    idx = []
    for size in reversed(shape):
        idx.append(flat % size)
        flat //= size
    return tuple(reversed(idx))


def mxfp4_group_globals(packed: torch.Tensor, kernel_scale: torch.Tensor,
                        global_scale: torch.Tensor, groups: int
                        ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The kernels' MXFP4 form (:func:`mxfp4_kernel_scales`) with one global scale per group of
    consecutive rows instead of one per row, exactly, or None where a group does not fit.

    The rows of ``[..., R, K/2]`` split into ``groups`` runs of ``R / groups`` (a MoE's w13: 2,
    gate and up; w2: 1). A group's global is the largest of its rows' ``2^j`` (rows of only
    +-0 codes left out; a group of only such rows: 1.0), and each block byte of a row drops
    by the row's distance ``j_group - j_row`` (blocks of only +-0 codes: 127), so every weight
    keeps its value bitwise. Why: the kernels read a row's global scale when its outputs are
    stored; one per group is one address per CTA instead of one per row.

    Args:
        packed: ``uint8 [..., R, K/2]`` codes (read to find all-zero blocks).
        kernel_scale, global_scale: ``float8_e8m0fnu [..., R, K/32]`` and ``float32 [..., R]``,
            as :func:`mxfp4_kernel_scales` returns them.
        groups: divides ``R``.

    Returns:
        ``(kernel_scale float8_e8m0fnu [..., R, K/32], global_scale float32 [..., groups])``,
        or None when a non-zero block would fall below :data:`MXFP4_KERNEL_SCALE_BYTES` (the
        per-row form then stays). A load-time step (one host sync per chunk of rows).

    Raises:
        ValueError: shapes that do not match, or ``groups`` not dividing ``R``.
    """
    rows_shape = tuple(packed.shape[:-1])
    if (packed.dim() < 2 or tuple(kernel_scale.shape[:-1]) != rows_shape
            or tuple(global_scale.shape) != rows_shape or groups < 1
            or rows_shape[-1] % groups):
        raise ValueError(
            f"mxfp4_group_globals: need packed [..., R, K/2], kernel_scale [..., R, K/32], "
            f"global_scale [..., R] and groups dividing R, got {tuple(packed.shape)}, "
            f"{tuple(kernel_scale.shape)}, {tuple(global_scale.shape)}, groups={groups}")
    num_rows, num_blocks = math.prod(rows_shape), kernel_scale.shape[-1]
    codes = packed.reshape(num_rows, packed.shape[-1])
    sbytes = as_ue8m0_bytes(kernel_scale).reshape(num_rows, num_blocks)
    step = max(1, _CONVERT_CHUNK_BLOCKS // max(num_blocks, 1))
    nz_rows = torch.zeros(num_rows, dtype=torch.bool, device=packed.device)
    for r0 in range(0, num_rows if num_blocks else 0, step):
        nz_rows[r0:r0 + step] = _nonzero_blocks(codes[r0:r0 + step], num_blocks).any(dim=-1)
    j_row = (global_scale.reshape(num_rows).view(torch.int32) >> 23) - UE8M0_BIAS
    j_row = torch.where(nz_rows, j_row, torch.full_like(j_row, -1000))
    j_group = j_row.view(-1, groups, rows_shape[-1] // groups).amax(dim=-1)
    j_group = torch.where(j_group > -1000, j_group, torch.zeros_like(j_group))
    shift = (j_group.unsqueeze(-1) - j_row.view(-1, groups, rows_shape[-1] // groups))
    shift = shift.reshape(num_rows).clamp(min=0).to(torch.int16)
    out = torch.empty_like(sbytes)
    lowest = MXFP4_KERNEL_SCALE_BYTES[0]
    for r0 in range(0, num_rows if num_blocks else 0, step):
        s = sbytes[r0:r0 + step].to(torch.int16) - shift[r0:r0 + step].unsqueeze(-1)
        nz = _nonzero_blocks(codes[r0:r0 + step], num_blocks)
        if bool((nz & (s < lowest)).any()):
            return None
        out[r0:r0 + step] = torch.where(nz, s, torch.full_like(s, UE8M0_BIAS)).to(torch.uint8)
    return (out.view(torch.float8_e8m0fnu).reshape(kernel_scale.shape),
            _global_of(j_group).reshape(*rows_shape[:-1], groups))
