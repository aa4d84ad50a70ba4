"""The permuted activation orders of the MoE's grouped GEMMs: which family reads which.

The MoE produces both of its GEMMs' activations itself (the gather kernel writes the GEMM-1
input, GEMM 1's SwiGLU epilogue writes GEMM 2's input), so it stores them in the k order the
GEMM's kernel family consumes without shuffling. The MMA sums over k, so any order A (weights)
and B (activations) agree on gives the same dot products (up to fp32 summation order). Dense
linears (user activations) keep the natural order. Three layouts (:data:`LAYOUTS`):

* ``natural``: k in order.
* ``kperm`` (:data:`KPERM_BLOCK` = 32, read by the **WGMMA** family, token tiles 16-256):
  inside every block of 32 consecutive k, stored position ``L`` holds the activation of
  physical k ``src(L) = 4 (L % 8) + L // 8`` (a 4 x 8 <-> 8 x 4 transpose). Why: the WGMMA
  kernel's A fragment (the weights, decoded in registers) gives lane ``c`` of a quad the
  logical k pairs ``16 s + 8 h + 2 c + {0, 1}`` (k16 step ``s``, half ``h``). With the
  activations (operand B, from shared memory) stored in this order, those logical pairs are
  the physical pairs ``(8 c + j, 8 c + j + 4)`` (``j = 2 s + h``) that the ``pair4`` decoder
  produces from the lane's own 4 checkpoint bytes (physical k ``8 c .. 8 c + 7``, one e4m3
  block scale): no byte gathering, one shared-memory word and one scale per row and 32 k.
* ``pair`` (:data:`PAIR_BLOCK` = 8, read by the **streamed** family, the 8-token tiles of
  MoE decode): inside every block of 8 consecutive k, stored position ``2 j`` holds k ``j`` and
  ``2 j + 1`` holds k ``j + 4`` (``j = 0..3``): ``pair_src(pos) = pos // 2 + 4 (pos % 2)``, a
  2 x 4 <-> 4 x 2 transpose. Why: the streamed kernel decodes a lane's u32 of 8 codes (k ``p ..
  p + 7``) with ``pair4`` into 4 bf16x2 registers holding k ``(p + j, p + j + 4)``; the MMA's
  B fragment must pair the same k. In pair order the lane's 16-byte activation load of those
  8 k is already the 4 registers ``b_j = (p + j, p + j + 4)``, instead of 4 ``prmt`` per
  (16-byte load, token tile) in the natural order.

Which order the MoE's activations take is the dispatch's to say (a
:class:`nvfp4_ops.kernels.dispatch.MoEPlan`'s ``act_order``: the permuted order of the tile's
family when both GEMMs have one, else natural).
A SwiGLU epilogue writes output feature ``f`` at the column :func:`stored_column` gives.
"""

from __future__ import annotations

import torch

__all__ = [
    "KPERM",
    "KPERM_BLOCK",
    "LAYOUTS",
    "NATURAL",
    "PAIR",
    "PAIR_BLOCK",
    "dst",
    "from_layout",
    "layout_block",
    "pair_dst",
    "pair_src",
    "permute_k",
    "permute_pairs",
    "src",
    "stored_column",
    "to_layout",
]

#: the layout names (see the module docstring)
NATURAL, KPERM, PAIR = "natural", "kperm", "pair"
LAYOUTS = (NATURAL, KPERM, PAIR)

#: the ``kperm`` permutation acts inside blocks of this many k
KPERM_BLOCK = 32
#: the ``pair`` permutation acts inside blocks of this many k
PAIR_BLOCK = 8


def src(pos: int) -> int:
    """``kperm``: physical k (within its 32-block) stored at position ``pos``."""
    return 4 * (pos % 8) + pos // 8


def dst(k: int) -> int:
    """``kperm``: stored position (within its 32-block) of physical k; the inverse of
    :func:`src`."""
    return 8 * (k % 4) + k // 4


def pair_src(pos: int) -> int:
    """``pair``: physical k (within its 8-block) stored at position ``pos``."""
    return pos // 2 + 4 * (pos % 2)


def pair_dst(k: int) -> int:
    """``pair``: stored position (within its 8-block) of physical k; the inverse of
    :func:`pair_src`."""
    return 2 * (k % 4) + k // 4


def layout_block(layout: str) -> int:
    """K block a layout permutes within (1 for ``natural``).

    Raises:
        ValueError: an unknown layout name.
    """
    blocks = {NATURAL: 1, KPERM: KPERM_BLOCK, PAIR: PAIR_BLOCK}
    if layout not in blocks:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return blocks[layout]


def stored_column(f: int, layout: str) -> int:
    """Column at which feature (physical k) ``f`` is stored in ``layout``."""
    block = layout_block(layout)
    if layout == KPERM:
        return f - f % block + dst(f % block)
    if layout == PAIR:
        return f - f % block + pair_dst(f % block)
    return f


def _index(k: int, layout: str, device, inverse: bool = False) -> torch.Tensor:
    """Gather index ``idx`` of a permuted layout: ``stored[..., p] = x[..., idx[p]]``
    (``inverse``: ``x[..., k] = stored[..., idx[k]]``)."""
    block = layout_block(layout)
    if k % block:
        raise ValueError(f"K={k} must be a multiple of {block} for the {layout!r} layout")
    fwd, inv = (src, dst) if layout == KPERM else (pair_src, pair_dst)
    idx = torch.tensor([(inv if inverse else fwd)(p) for p in range(block)], device=device)
    return (torch.arange(0, k, block, device=device)[:, None] + idx).reshape(-1)


def permute_k(x: torch.Tensor) -> torch.Tensor:
    """``x[..., K]`` (``K % 32 == 0``) in the ``kperm`` order: ``out[..., 32 b + p] = x[...,
    32 b + src(p)]``."""
    return x[..., _index(x.shape[-1], KPERM, x.device)]


def permute_pairs(x: torch.Tensor) -> torch.Tensor:
    """``x[..., K]`` (``K % 8 == 0``) in the ``pair`` order: ``out[..., 8 b + p] = x[..., 8 b +
    pair_src(p)]``."""
    return x[..., _index(x.shape[-1], PAIR, x.device)]


def to_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x[..., K]`` (natural order) stored in ``layout`` (a copy; ``x`` itself for
    ``natural``).

    Raises:
        ValueError: an unknown layout, or ``K`` not a multiple of its block.
    """
    if layout_block(layout) == 1:
        return x
    return x[..., _index(x.shape[-1], layout, x.device)]


def from_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The inverse of :func:`to_layout`: ``x[..., K]`` stored in ``layout`` -> natural order.

    Raises:
        ValueError: an unknown layout, or ``K`` not a multiple of its block.
    """
    if layout_block(layout) == 1:
        return x
    return x[..., _index(x.shape[-1], layout, x.device, inverse=True)]
