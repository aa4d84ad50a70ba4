"""``nvfp4::to_wperm_``: packed FP4 weights from the checkpoint bit order to the ``wperm``
order (or back), in place: the load-time preparation of MoE weights for ``nvfp4::moe(...,
wperm=True)``, whose GPU kernels decode that order with fewer instructions.

The layout is :mod:`nvfp4_ops.orders.wperm`'s: a fixed permutation of the 32 bits of every
little-endian u32 word (every 4 bytes of a row); byte positions, block scales and global scales
are unchanged. One pure-torch implementation serves every device (bit moves on int64 copies of
64 MiB row blocks), so the CPU path accepts whatever the GPU path accepts.
"""

from __future__ import annotations

import torch

from nvfp4_ops._library import qualname
from nvfp4_ops._validate import check_codes_in_place
from nvfp4_ops.orders import wperm as _layout

__all__ = ["to_wperm_"]


def _check(w: torch.Tensor) -> None:
    check_codes_in_place("nvfp4.to_wperm_", w, 4, "K/2 a multiple of 4 (whole u32 words)")


@torch.library.custom_op(qualname("to_wperm_"), mutates_args=("w",))
def _to_wperm_op(w: torch.Tensor, inverse: bool) -> None:
    _check(w)
    _layout.permute_(w, inverse)


@_to_wperm_op.register_fake
def _(w, inverse):
    _check(w)


def to_wperm_(w: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
    """Packed NVFP4 codes ``uint8 [..., K/2]`` (contiguous, ``K % 8 == 0``) from the checkpoint
    order to the ``wperm`` bit order, in place (``inverse=True``: back). Exact (a bit
    permutation); temporaries of one 64 MiB row block, never a second copy of ``w``.

    For ``nvfp4.moe(..., wperm=True)``: prepare ``w13`` and ``w2`` once, at load time.
    Returns ``w``.

    Raises:
        NVFP4InputError: not uint8, a last dimension that is not a multiple of 4, or not
            contiguous.
    """
    torch.ops.nvfp4.to_wperm_(w, inverse)
    return w
