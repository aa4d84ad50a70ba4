"""The orders the kernels read weights and activations in, as pure-torch permutations.

Each module states one order, how to convert to and from it, and why a kernel family reads
it (fewer decode instructions, no byte gathering):

* :mod:`~nvfp4_ops.orders.wperm`: a bit order inside every u32 word of FP4 codes
  (``nvfp4::to_wperm_``; the MoE's weights).
* :mod:`~nvfp4_ops.orders.wfrag`: dense weights stored in the order the kernels' MMA
  fragments consume them (``nvfp4::to_wfrag_``; the dense linears).
* :mod:`~nvfp4_ops.orders.kperm`: the permuted k orders of the MoE's activations, which the
  MoE writes itself.

They sit beside :mod:`nvfp4_ops.format`, below the references and the kernels, which both
read them: the references undo an order exactly; the kernels' decoders assume it.
:class:`WeightOrder` names how a weight tensor's codes are stored: the kernel configs carry
one, and the dispatch plans with it.
"""

from __future__ import annotations

import enum

__all__ = ["WeightOrder"]


class WeightOrder(enum.Enum):
    """How a weight tensor's FP4 codes are stored (the scales never move).

    * ``CHECKPOINT``: as in the checkpoint (low nibble = even k).
    * ``WPERM``: the 32 bits of every u32 word permuted (:mod:`nvfp4_ops.orders.wperm`), a
      cheaper decode; read by the kernels with a permuted activation order (the MoE's).
    * ``WFRAG``: MMA-fragment order inside every 32-k block, then the ``wperm`` bits
      (:mod:`nvfp4_ops.orders.wfrag`); read by every dense family with natural activations.
    """

    CHECKPOINT = "checkpoint"
    WPERM = "wperm"
    WFRAG = "wfrag"

    @property
    def wperm_bits(self) -> bool:
        """The codes of every u32 word are in the ``wperm`` bit order (WPERM and WFRAG)."""
        return self is not WeightOrder.CHECKPOINT

    @property
    def fragment_order(self) -> bool:
        """The codes are in the MMA-fragment order of :mod:`nvfp4_ops.orders.wfrag` (WFRAG)."""
        return self is WeightOrder.WFRAG
