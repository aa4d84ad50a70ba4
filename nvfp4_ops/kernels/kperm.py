"""The k-permuted activation layout of the MoE's WGMMA GEMMs.

Inside every block of 32 consecutive k, stored position ``L`` holds the activation of physical
k ``src(L) = 4 (L % 8) + L // 8`` (a 4 x 8 <-> 8 x 4 transpose). Why: the WGMMA kernel's A
fragment (the weights, decoded in registers) gives lane ``c`` of a quad the logical k pairs
``16 s + 8 h + 2 c + {0, 1}`` (k16 step ``s``, half ``h``). With the activations (operand B,
from shared memory) stored in this order, those logical pairs are the physical pairs
``(8 c + j, 8 c + j + 4)`` (``j = 2 s + h``) that the ``pair4`` decoder produces from the lane's
own 4 checkpoint bytes (physical k ``8 c .. 8 c + 7``, one e4m3 block scale): no byte
gathering, one shared-memory word and one scale per row and 32 k. The MMA sums
over k, so any order A and B agree on gives the same dot products (up to fp32 summation order).

The MoE produces both of its GEMMs' activations itself: the gather kernel writes the GEMM-1
input in this order, and GEMM 1's SwiGLU epilogue writes GEMM 2's input in this order. Dense
linears (user activations) keep the natural order.
"""

from __future__ import annotations

import torch

__all__ = ["KPERM_BLOCK", "dst", "permute_k", "src"]

#: the permutation acts inside blocks of this many k
KPERM_BLOCK = 32


def src(pos: int) -> int:
    """Physical k (within its 32-block) stored at position ``pos``."""
    return 4 * (pos % 8) + pos // 8


def dst(k: int) -> int:
    """Stored position (within its 32-block) of physical k; the inverse of :func:`src`."""
    return 8 * (k % 4) + k // 4


def permute_k(x: torch.Tensor) -> torch.Tensor:
    """``x[..., K]`` (``K % 32 == 0``) in the stored order: ``out[..., 32 b + p] = x[..., 32 b
    + src(p)]``."""
    k = x.shape[-1]
    if k % KPERM_BLOCK:
        raise ValueError(f"K={k} must be a multiple of {KPERM_BLOCK}")
    idx = torch.tensor([src(p) for p in range(KPERM_BLOCK)], device=x.device)
    idx = (torch.arange(0, k, KPERM_BLOCK, device=x.device)[:, None] + idx).reshape(-1)
    return x[..., idx]
