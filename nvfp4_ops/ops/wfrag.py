"""``nvfp4::to_wfrag_``: packed FP4 weights of a dense linear from the checkpoint order to the
prepared order that ``nvfp4::linear`` / ``nvfp4::mlp`` read with ``wfrag=True`` (or back), in
place.

The order is :func:`nvfp4_ops.orders.wfrag.prepare_`'s: inside every 32-k block of a row the
codes are moved into MMA-fragment order (:mod:`nvfp4_ops.orders.wfrag`), then the bits of
every u32 word into the ``wperm`` order (:mod:`nvfp4_ops.orders.wperm`). Block scales and
global scales are unchanged. One pure-torch implementation serves every device.
"""

from __future__ import annotations

import torch

from nvfp4_ops._library import qualname
from nvfp4_ops._validate import check_codes_in_place
from nvfp4_ops.orders import wfrag as _layout

__all__ = ["to_wfrag_"]


def _check(w: torch.Tensor) -> None:
    check_codes_in_place("nvfp4.to_wfrag_", w, 16, "K a multiple of 32")


@torch.library.custom_op(qualname("to_wfrag_"), mutates_args=("w",))
def _to_wfrag_op(w: torch.Tensor, inverse: bool) -> None:
    _check(w)
    _layout.prepare_(w, inverse)


@_to_wfrag_op.register_fake
def _(w, inverse):
    _check(w)


def to_wfrag_(w: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
    """Packed NVFP4 codes ``uint8 [..., K/2]`` (contiguous, ``K % 32 == 0``) from the checkpoint
    order to the order ``nvfp4.linear(..., wfrag=True)`` and ``nvfp4.mlp(..., wfrag=True)``
    read, in place (``inverse=True``: back). Exact (a permutation of the codes' bits within
    each 16-byte block of a row); temporaries of one row block, never a second copy of ``w``.

    Prepare a dense layer's weights once, at load time. Returns ``w``.

    Raises:
        NVFP4InputError: not uint8, a last dimension that is not a multiple of 16, or not
            contiguous.
    """
    torch.ops.nvfp4.to_wfrag_(w, inverse)
    return w
