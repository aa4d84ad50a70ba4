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
"""
