"""PTX building blocks shared by the W4A16 NVFP4 kernels (sm_90a): global and shared loads at
static offsets, exact e4m3 block-scale conversion, the FP4 (e2m1) decoders and ``mma.sync``.

The FP4 decoders turn one u32 of 8 e2m1 codes (code j in nibble j, low nibble = even k, as in
checkpoints) into 4 bf16x2 words, already multiplied by the e4m3 block scale: codes (2j, 2j+1)
in word j for ``lut`` and ``shift``, codes (j, j+4) for ``pair4``. All are exact: e2m1
(2 significant bits) times e4m3 (4 significant bits) fits bf16's 8-bit significand. See each
function for the bit tricks. MXFP4 block scales (UE8M0, one per 32 k: powers of two) enter
the same decoders through :func:`mx_scale_pre` / :func:`mx_pair_pre`.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.arch import inline_ptx

from nvfp4_ops.format import MXFP4_KERNEL_SCALE_BYTES
from nvfp4_ops.orders.wperm import MAG_MASK, PAIR_SHIFTS, SIGN_MASK

__all__ = [
    "bf16x2_halves",
    "decode_reg_pair4",
    "decode_reg_wperm",
    "decode_word_pair4",
    "decode_word_pair4_2s",
    "decode_word_shift",
    "decode_word_wperm",
    "decode_word_wperm_2s",
    "gather_decode",
    "ld_u16",
    "ld_shared_v4_at",
    "ld_u16_at",
    "ld_v4",
    "ld_v4_at",
    "mma_m16n8k16",
    "mx_pair_pre",
    "mx_pair_selector",
    "mx_scale_pre",
    "scale_pair_pre",
    "scales_to_bf16x2_pre",
]

@cute.jit
def ld_v4(addr: Int64):
    """16-byte read-only global load (address must be 16-byte aligned)."""
    return inline_ptx(
        "ld.global.nc.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
        write_only_types=[Int32, Int32, Int32, Int32],
        read_only_args=[addr],
    )


@cute.jit
def ld_u16(addr: Int64):
    """2-byte read-only global load, zero-extended to 32 bits."""
    return inline_ptx(
        "ld.global.nc.u16 {$w0}, [{$r0}];",
        write_only_types=[Int32],
        read_only_args=[addr],
    )


_PRESCALE = "0x7B007B00"  # 2^119 in both halves of a bf16x2


def _pair_ptx(prescale: str, split: bool) -> str:
    """PTX: two e4m3 bytes (low 16 bits of $r0) -> one bf16x2 (scale 0 low, scale 1 high),
    optionally multiplied by the bf16x2 power of two ``prescale``; with ``split``, that word's
    halves each broadcast into a word of their own ($w0, $w1) instead.

    The pair is packed first and scaled by one ``mul.rn.bf16x2``: 5 SASS instructions for two
    scales, against 7 for two words converted and scaled separately. ptxas folds a broadcast
    (a ``mov`` of one half into both) into the operand swizzle (``.H0_H0`` / ``.H1_H1``) of the
    ``HMUL2`` that consumes it, when both sit in the same block (sm_90a; a broadcast carried
    across a loop edge costs a ``PRMT``: see :func:`bf16x2_halves`)."""
    mul = (f"mov.b32 c2, {prescale};\n" "mul.rn.bf16x2 pk, pk, c2;\n") if prescale else ""
    out = ("mov.b32 {b0, b1}, pk;\n" "mov.b32 {$w0}, {b0, b0};\n" "mov.b32 {$w1}, {b1, b1};\n"
           if split else "mov.b32 {$w0}, pk;\n")
    return (
        "{\n"
        ".reg .b16 s16, h0, h1, b0, b1;\n"
        ".reg .b32 hh, pk, c2;\n"
        ".reg .f32 f0, f1;\n"
        "cvt.u16.u32 s16, {$r0};\n"
        "cvt.rn.f16x2.e4m3x2 hh, s16;\n"
        "mov.b32 {h0, h1}, hh;\n"
        "cvt.f32.f16 f0, h0;\n"
        "cvt.f32.f16 f1, h1;\n"
        "cvt.rn.bf16x2.f32 pk, f1, f0;\n"
        + mul + out + "}"
    )


def scale_pair_pre(two_scales: Int32):
    """Two e4m3 bytes (low 16 bits) -> one bf16x2: ``scale_0 * 2^119`` (low half),
    ``scale_1 * 2^119`` (high half), exact as :func:`scales_to_bf16x2_pre`. For a loop that
    carries the pair: split it with :func:`bf16x2_halves` next to the decoder that uses it."""
    return inline_ptx(_pair_ptx(_PRESCALE, False), write_only_types=[Int32],
                      read_only_args=[two_scales])


# A UE8M0 byte b becomes scale * 2^119 (the e4m3 path's prescale) as the bf16 exponent field
# b + 119: (b + 119) << 7 in each half = b * 0x80 per half + 119 * 0x00800080. Exact for the
# bytes of MXFP4_KERNEL_SCALE_BYTES: b + 119 <= 254 (no inf), and from b + 119 >= 128 a decoded
# code (e2m1 * 2^-126, 0.5 the smallest) times the factor is a normal bf16. The load-time
# rebase (format.mxfp4_kernel_scales) keeps every row inside that window.
_MX_EXP_BIAS = 119
_MX_BIAS = _MX_EXP_BIAS * 0x00800080
assert MXFP4_KERNEL_SCALE_BYTES == (128 - _MX_EXP_BIAS, 254 - _MX_EXP_BIAS)


def mx_scale_pre(byte: Int32):
    """One UE8M0 byte ``b`` (bits 0-7, zero above) -> bf16x2 ``2^(b - 127) * 2^119`` in both
    halves: the ``scale2`` of the decoders, one ``mad`` (exact for ``b`` in
    :data:`nvfp4_ops.format.MXFP4_KERNEL_SCALE_BYTES`)."""
    return inline_ptx(f"mad.lo.u32 {{$w0}}, {{$r0}}, {0x00800080:#010x}, {_MX_BIAS:#010x};",
                      write_only_types=[Int32], read_only_args=[byte])


def mx_pair_pre(lo: Int32, hi: Int32, j: int):
    """Byte ``j`` (0 or 1) of two rows' UE8M0 scale pairs ``lo`` / ``hi`` (two bytes each in bits
    0-15, zero above, as ``ld.u16`` leaves them) -> one bf16x2: ``scale_lo * 2^119`` (low half),
    ``scale_hi * 2^119`` (high half), like :func:`scale_pair_pre` for e4m3. A ``prmt`` puts the
    bytes at bits 0 and 16 (zeros from ``lo``'s byte 2 between them), a ``mad`` shifts and
    biases both exponent fields."""
    return inline_ptx(
        "{\n.reg .b32 t;\n"
        f"prmt.b32 t, {{$r0}}, {{$r1}}, {mx_pair_selector(j):#06x};\n"
        f"mad.lo.u32 {{$w0}}, t, 128, {_MX_BIAS:#010x};\n}}",
        write_only_types=[Int32], read_only_args=[lo, hi])


def mx_pair_selector(j: int) -> int:
    """The ``prmt`` selector of :func:`mx_pair_pre`: result bytes (``lo`` byte ``j``, ``lo``
    byte 2 = 0, ``hi`` byte ``j``, ``lo`` byte 2 = 0), i.e. ``lo_j | hi_j << 16``."""
    return j | (2 << 4) | ((4 + j) << 8) | (2 << 12)


def bf16x2_halves(word: Int32):
    """``(low half twice, high half twice)`` of a bf16x2 word. Free when the results feed
    ``mul.rn.bf16x2`` in the same block (ptxas uses ``HMUL2`` operand swizzles instead)."""
    return inline_ptx(
        "{\n.reg .b16 b0, b1;\nmov.b32 {b0, b1}, {$r0};\n"
        "mov.b32 {$w0}, {b0, b0};\nmov.b32 {$w1}, {b1, b1};\n}",
        write_only_types=[Int32, Int32],
        read_only_args=[word],
    )


def ld_v4_at(addr: Int64, offset: int):
    """16-byte read-only global load at ``addr + offset`` (static byte offset, 16-B aligned)."""
    return inline_ptx(
        f"ld.global.nc.v4.b32 {{{{$w0}}, {{$w1}}, {{$w2}}, {{$w3}}}}, [{{$r0}}+{offset}];",
        write_only_types=[Int32, Int32, Int32, Int32],
        read_only_args=[addr],
    )


def ld_shared_v4_at(addr: Int32, offset: int):
    """16-byte shared-memory load at ``addr + offset`` (32-bit shared address, 16-B aligned)."""
    return inline_ptx(
        f"ld.shared.v4.b32 {{{{$w0}}, {{$w1}}, {{$w2}}, {{$w3}}}}, [{{$r0}}+{offset}];",
        write_only_types=[Int32, Int32, Int32, Int32],
        read_only_args=[addr],
    )


def ld_u16_at(addr: Int64, offset: int):
    """2-byte read-only global load at ``addr + offset``, zero-extended to 32 bits."""
    return inline_ptx(
        f"ld.global.nc.u16 {{$w0}}, [{{$r0}}+{offset}];",
        write_only_types=[Int32],
        read_only_args=[addr],
    )


def scales_to_bf16x2_pre(two_scales: Int32):
    """Two e4m3 bytes (low 16 bits) -> (bf16x2 of scale 0 twice, bf16x2 of scale 1 twice),
    times 2^119 (for the ``shift`` decoder). e4m3 -> f16 -> f32 -> bf16 is exact at every step.

    ``scale * 2^119`` is exact in bf16 (e4m3 max 448 < 2^9, so < 2^128; the smallest e4m3,
    2^-9, is a normal bf16, and a power-of-two product of normals stays exact).
    """
    return inline_ptx(_pair_ptx(_PRESCALE, True), write_only_types=[Int32, Int32],
                      read_only_args=[two_scales])


def _decoder_call(body: list[str], word: Int32, scale2: Int32):
    """Emit a decoder's PTX ``body`` (opened with ``{``) for one u32 of codes and a bf16x2
    scale; returns its 4 bf16x2 words."""
    return inline_ptx(
        "".join(body) + "}",
        write_only_types=[Int32, Int32, Int32, Int32],
        read_only_args=[word, scale2],
    )


def decode_word_shift(word: Int32, scale2: Int32):
    """8 e2m1 codes (code j in nibble j) -> 4 bf16x2 pairs (codes 2j, 2j+1) * scale * 2^-7.

    Pair j: a byte permute puts code 2j in bits 12-15 and code 2j+1 in bits 28-31 (byte j of
    ``word << 4`` and of ``word``); then the sign bits stay (bit 15 / 31) and the 3 magnitude
    bits move right by 6 into the low exponent bits + top mantissa bit of each bf16. That bf16
    is exactly ``e2m1 * 2^-126`` (code 1 = 0.5 becomes the subnormal 2^-127; bf16 arithmetic
    keeps subnormals). ``scale2`` holds ``scale * 2^119`` (:func:`scales_to_bf16x2_pre`), so
    the product is exactly ``e2m1 * scale * 2^-7`` (all normal bf16 values); the epilogue
    multiplies the fp32 accumulator by 2^7 (exact). Same pairs, same k order as ``lut``.
    """
    body = ["{\n", ".reg .b32 q4, r, t;\n", "shl.b32 q4, {$r0}, 4;\n"]
    for j in range(4):
        sel = (j << 12) | (j << 8) | ((4 + j) << 4) | j
        body += [
            f"prmt.b32 r, {{$r0}}, q4, {sel:#06x};\n",
            "and.b32 t, r, 0x70007000;\n",
            "shr.u32 t, t, 6;\n",
            "and.b32 r, r, 0x80008000;\n",
            "or.b32 r, r, t;\n",
            f"mul.rn.bf16x2 {{$w{j}}}, r, {{$r1}};\n",
        ]
    return _decoder_call(body, word, scale2)


@cute.jit
def mma_m16n8k16(acc: cute.Tensor, base: int, a0, a1, a2, a3, b0, b1):
    """acc[base:base+4] += A(16x16 bf16) @ B(16x8 bf16), mma.sync m16n8k16, fp32 accumulate."""
    d0, d1, d2, d3 = inline_ptx(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{{$w0}, {$w1}, {$w2}, {$w3}}, {{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, "
        "{{$r6}, {$r7}, {$r8}, {$r9}};",
        write_only_types=[Float32, Float32, Float32, Float32],
        read_only_args=[
            a0, a1, a2, a3, b0, b1, acc[base], acc[base + 1], acc[base + 2], acc[base + 3]
        ],
    )
    acc[base] = d0
    acc[base + 1] = d1
    acc[base + 2] = d2
    acc[base + 3] = d3


def _pair4_body(j: int) -> list[str]:
    """``pair4``'s integer part for register ``j`` (into ``r``; temporaries ``wr``, ``q``)."""
    if j < 2:
        src_q, sh_q = "{$r0}", 6 - 4 * j
    else:
        src_q, sh_q = "wr", 14 - 4 * j
    sh_r = 12 - 4 * j
    return [
        f"shl.b32 r, {{$r0}}, {sh_r};\n" if sh_r else "mov.b32 r, {$r0};\n",
        f"shl.b32 q, {src_q}, {sh_q};\n",
        "and.b32 q, q, 0x01C001C0;\n",
        "and.b32 r, r, 0x80008000;\n",
        "or.b32 r, r, q;\n",
    ]


def _wperm_body(j: int) -> list[str]:
    """The ``wperm`` decoder's integer part for register ``j`` (into ``r``; temporary ``q``)."""
    def shifted(dst: str, s: int) -> str:
        if s == 0:
            return f"mov.b32 {dst}, {{$r0}};\n"
        op = "shl.b32" if s > 0 else "shr.u32"
        return f"{op} {dst}, {{$r0}}, {abs(s)};\n"

    a, b = PAIR_SHIFTS[j]
    if a == b:
        return [shifted("r", a), f"and.b32 r, r, {SIGN_MASK | MAG_MASK:#010x};\n"]
    return [shifted("r", a), shifted("q", b), f"and.b32 q, q, {MAG_MASK:#010x};\n",
            f"and.b32 r, r, {SIGN_MASK:#010x};\n", "or.b32 r, r, q;\n"]


def _pair_decoder(reg_body, word: Int32, scales: tuple):
    """4 bf16x2 words from one u32: ``reg_body(j)``'s integer part of register ``j``, times
    ``scales[0]`` (one scale for all four) or ``scales[j // 2]`` (two: registers 0-1 and 2-3)."""
    if reg_body is _pair4_body:
        body = ["{\n", ".reg .b32 wr, r, q;\n", "shr.b32 wr, {$r0}, 8;\n"]
    else:
        body = ["{\n", ".reg .b32 r, q;\n"]
    for j in range(4):
        body += reg_body(j)
        scale = 1 + (j // 2 if len(scales) == 2 else 0)
        body.append(f"mul.rn.bf16x2 {{$w{j}}}, r, {{$r{scale}}};\n")
    return inline_ptx(
        "".join(body) + "}",
        write_only_types=[Int32, Int32, Int32, Int32],
        read_only_args=[word, *scales],
    )


def _one_register(reg_body, word: Int32, j: int, scale2: Int32):
    prologue = (["{\n", ".reg .b32 wr, r, q;\n", "shr.b32 wr, {$r0}, 8;\n"]
                if reg_body is _pair4_body and j >= 2 else ["{\n", ".reg .b32 r, q;\n"])
    body = prologue + reg_body(j) + ["mul.rn.bf16x2 {$w0}, r, {$r1};\n"]
    return inline_ptx("".join(body) + "}", write_only_types=[Int32],
                      read_only_args=[word, scale2])


def decode_reg_pair4(word: Int32, j: int, scale2: Int32):
    """Register ``j`` (static, 0-3) of :func:`decode_word_pair4` alone: (code j, code j+4) *
    scale * 2^-7, for loops that take one register of several words at a time (the ``wfrag``
    order in the streamed and ``mma.sync`` kernels)."""
    return _one_register(_pair4_body, word, j, scale2)


def decode_reg_wperm(word: Int32, j: int, scale2: Int32):
    """Register ``j`` of :func:`decode_word_wperm` alone, as :func:`decode_reg_pair4`."""
    return _one_register(_wperm_body, word, j, scale2)


def decode_word_pair4(word: Int32, scale2: Int32):
    """8 e2m1 codes (code j in nibble j) -> 4 bf16x2 words, word j = (code j, code j+4) *
    scale * 2^-7, with ``scale2`` = ``scale * 2^119`` twice (fp4_ptx.scales_to_bf16x2_pre).
    The bit moves are explained in ``w4a16_stream``'s module docstring (its decoder)."""
    return _pair_decoder(_pair4_body, word, (scale2,))


def decode_word_pair4_2s(word: Int32, scale_a: Int32, scale_b: Int32):
    """:func:`decode_word_pair4` with words 0-1 scaled by ``scale_a`` and words 2-3 by
    ``scale_b`` (the ``wfrag`` weight order of :mod:`nvfp4_ops.orders.wfrag`: a word's
    registers 0-1 hold k of a 32-block's first 16, registers 2-3 of its second)."""
    return _pair_decoder(_pair4_body, word, (scale_a, scale_b))


def decode_word_wperm(word: Int32, scale2: Int32):
    """:func:`decode_word_pair4`'s output (4 bf16x2 words, word j = (code j, code j+4) * scale *
    2^-7, ``scale2`` = ``scale * 2^119`` twice) from a u32 whose bits are in the ``wperm`` order
    of :mod:`nvfp4_ops.orders.wperm` (one shift and one mask per register, or two and two;
    11 integer instructions per word instead of 16)."""
    return _pair_decoder(_wperm_body, word, (scale2,))


def decode_word_wperm_2s(word: Int32, scale_a: Int32, scale_b: Int32):
    """:func:`decode_word_wperm` with two scales, as :func:`decode_word_pair4_2s`."""
    return _pair_decoder(_wperm_body, word, (scale_a, scale_b))


def gather_decode(w0, w1, w2, w3, sel, scale_a, scale_b):
    """16 bytes of one weight row (32 k) -> this lane's A registers of two k16 steps.

    ``sel`` = ``c | (c+4) << 4 | c << 8 | (c+4) << 12`` picks byte ``c`` of two words. The
    gathered word holds the code pairs (k 2c, 2c+1), (2c+8, 2c+9) of step 0 and the same of
    step 1; it is decoded as in :func:`nvfp4_ops.kernels.cute.fp4_ptx.decode_word_shift`, pairs 0-1
    times ``scale_a`` (step 0's block scale * 2^119, bf16x2), pairs 2-3 times ``scale_b``.
    Returns (step0 k 2c, step0 k 2c+8, step1 k 2c, step1 k 2c+8) bf16x2 words.
    """
    body = [
        "{\n",
        ".reg .b32 x, y, v, q4, r, t;\n",
        "prmt.b32 x, {$r0}, {$r1}, {$r4};\n",
        "prmt.b32 y, {$r2}, {$r3}, {$r4};\n",
        "prmt.b32 v, x, y, 0x5410;\n",
        "shl.b32 q4, v, 4;\n",
    ]
    for j in range(4):
        sel_j = (j << 12) | (j << 8) | ((4 + j) << 4) | j
        scale = "{$r5}" if j < 2 else "{$r6}"
        body += [
            f"prmt.b32 r, v, q4, {sel_j:#06x};\n",
            "and.b32 t, r, 0x70007000;\n",
            "shr.u32 t, t, 6;\n",
            "and.b32 r, r, 0x80008000;\n",
            "or.b32 r, r, t;\n",
            f"mul.rn.bf16x2 {{$w{j}}}, r, {scale};\n",
        ]
    body.append("}")
    return inline_ptx(
        "".join(body),
        write_only_types=[Int32, Int32, Int32, Int32],
        read_only_args=[w0, w1, w2, w3, sel, scale_a, scale_b],
    )
