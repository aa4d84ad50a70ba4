"""``wperm``: an in-word bit order of the FP4 codes that makes the ``pair4`` decode cheaper
(``nvfp4::moe(..., wperm=True)`` reads MoE weights prepared with ``nvfp4::to_wperm_``).

The ``pair4`` decoder (:func:`nvfp4_ops.kernels.cute.fp4_ptx.decode_word_pair4`) turns a u32
of 8 checkpoint codes (code ``c`` in nibble ``c``: magnitude bits ``4c .. 4c+2``, sign bit
``4c+3``) into 4 bf16x2 registers, register ``j`` = (code ``j``, code ``j + 4``), by moving
each code's 3 magnitude bits to bf16 bits 6-8 (22-24 for the high half) and its sign to bit 15
(31). In the checkpoint order the sign and the magnitude of a code need different shifts
(``12 - 4j`` and ``6 - 4j``), so every register costs two shifts and two logic ops (masking the
magnitude, then ``(sign & mask) | magnitude``): 16 integer instructions per word in the SASS.

Stored in the order of :data:`PAIR_SHIFTS` instead (a fixed permutation of the 32 bits of every
little-endian u32 word of ``w``, bytes ``4i .. 4i+3`` of a row), register ``j`` is
``((w << a_j) & SIGN_MASK) | ((w << b_j) & MAG_MASK)`` with ``(a_j, b_j) = PAIR_SHIFTS[j]``
(negative = right shift), and when ``a_j == b_j`` a single ``(w << a_j) & (SIGN_MASK |
MAG_MASK)``: 5 distinct shifts and 6 logic ops, 11 integer instructions per word. The shifts
were found by exhaustive search (2 registers with one shift each and 2 with two: no choice of
4 single shifts tiles the 32 bits). The registers are bit-identical to ``pair4``'s on the
checkpoint word, so the MMAs, their k order and every output are bitwise unchanged.

Why a permutation inside the word only: every consumer of ``pair4`` (the streamed kernel, the
WGMMA kernel's ``kperm`` path) loads whole u32 words at the same byte offsets, so addressing,
TMA boxes and shared-memory layouts stay as they are; only the decoder changes.

What it saves on the GPU, and the command that measures it: ``nvfp4_ops/kernels/DESIGN.md``,
section 8 ("Weight bit order").
"""

from __future__ import annotations

import functools

import torch

__all__ = [
    "MAG_MASK",
    "PAIR_SHIFTS",
    "SIGN_MASK",
    "emulate_pair4",
    "emulate_wperm",
    "from_wperm",
    "permute_",
    "source_bit",
    "to_wperm",
]

#: register ``j``: (shift that puts the two sign bits at 15 / 31, shift that puts the two
#: magnitudes at 6-8 / 22-24); positive = left, negative = right
PAIR_SHIFTS = ((0, 0), (1, 3), (6, 6), (2, -4))
SIGN_MASK = 0x80008000
MAG_MASK = 0x01C001C0


@functools.cache
def source_bit() -> tuple[int, ...]:
    """``source_bit()[p]``: the checkpoint bit of a u32 word that the ``wperm`` word holds at
    bit ``p`` (a permutation of ``range(32)``)."""
    src = [-1] * 32
    for j, (a, b) in enumerate(PAIR_SHIFTS):
        for half, code in ((0, j), (16, j + 4)):
            for bit in range(3):  # magnitude bit `bit` of the code -> bf16 bit 6 + bit (+16)
                src[half + 6 + bit - b] = 4 * code + bit
            src[half + 15 - a] = 4 * code + 3
    assert sorted(src) == list(range(32)), src
    return tuple(src)


def _move(words: torch.Tensor, src: tuple[int, ...]) -> torch.Tensor:
    """Bit ``p`` of each output word = bit ``src[p]`` of the input word (int64 holding u32)."""
    out = torch.zeros_like(words)
    by_delta: dict[int, int] = {}
    for p, s in enumerate(src):
        by_delta[p - s] = by_delta.get(p - s, 0) | (1 << p)
    for delta, mask in by_delta.items():
        moved = words << delta if delta >= 0 else words >> -delta
        out |= moved & mask
    return out


def _permute(w: torch.Tensor, src: tuple[int, ...], out: torch.Tensor) -> torch.Tensor:
    """``out`` = ``w`` with the bits of every u32 word moved by ``src``; ``out`` may be ``w``
    (each row block is read whole before it is written)."""
    if w.dtype != torch.uint8 or w.dim() < 1 or w.shape[-1] % 4 != 0:
        raise ValueError(f"w must be uint8 with a last dim that is a multiple of 4 (u32 words), "
                         f"got {w.dtype} {tuple(w.shape)}")
    flat, flat_out = w.reshape(-1, w.shape[-1]), out.view(-1, w.shape[-1])
    # row blocks bound the int64 temporaries (8x the bytes of the block)
    step = max(1, (1 << 26) // max(1, flat.shape[1]))
    for r in range(0, flat.shape[0], step):
        words = flat[r:r + step].contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        moved = _move(words, src)
        moved = torch.where(moved >= 2**31, moved - 2**32, moved).to(torch.int32)
        flat_out[r:r + step] = moved.view(torch.uint8)
    return out


def _inverse() -> tuple[int, ...]:
    inv = [0] * 32
    for p, s in enumerate(source_bit()):
        inv[s] = p
    return tuple(inv)


def to_wperm(w: torch.Tensor) -> torch.Tensor:
    """Checkpoint-order packed codes ``uint8 [..., K/2]`` (K % 8 == 0) -> the ``wperm`` order
    (same shape, dtype and device; a new contiguous tensor)."""
    return _permute(w, source_bit(), torch.empty_like(w, memory_format=torch.contiguous_format))


def from_wperm(w: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_wperm`."""
    return _permute(w, _inverse(), torch.empty_like(w, memory_format=torch.contiguous_format))


def permute_(w: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """:func:`to_wperm` (``inverse``: :func:`from_wperm`) in place on a contiguous ``w``,
    with temporaries of one 64 MiB row block (for the load-time preparation of experts that
    fill the GPU). Returns ``w``."""
    if not w.is_contiguous():
        raise ValueError("w must be contiguous for the in-place permutation")
    return _permute(w, _inverse() if inverse else source_bit(), w)


def _shift(words: torch.Tensor, s: int) -> torch.Tensor:
    return ((words << s) if s >= 0 else (words >> -s)) & 0xFFFFFFFF


def emulate_wperm(words: torch.Tensor) -> torch.Tensor:
    """The ``wperm`` decoder's integer part on int64 tensors holding u32 words: ``[4, *shape]``
    bf16x2 bit patterns before the scale multiply (``e2m1 * 2^-126`` per half), as
    :func:`nvfp4_ops.kernels.cute.fp4_ptx.decode_word_wperm` computes them."""
    regs = []
    for a, b in PAIR_SHIFTS:
        if a == b:
            regs.append(_shift(words, a) & (SIGN_MASK | MAG_MASK))
        else:
            regs.append((_shift(words, a) & SIGN_MASK) | (_shift(words, b) & MAG_MASK))
    return torch.stack(regs)


def emulate_pair4(words: torch.Tensor) -> torch.Tensor:
    """The ``pair4`` decoder's integer part on checkpoint words (same output as
    :func:`emulate_wperm` on the permuted words)."""
    regs = []
    for j in range(4):
        regs.append((_shift(words, 12 - 4 * j) & SIGN_MASK)
                    | (_shift(words, 6 - 4 * j) & MAG_MASK))
    return torch.stack(regs)
