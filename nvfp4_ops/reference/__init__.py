"""Pure-torch references for every op. No GPU imports; the CPU kernels *are* these.

They run on any device (a CUDA tensor runs them on the GPU, slowly) and define the numerics
that the GPU kernels must reproduce up to fp32 summation order:

* weights enter the reduction as ``e2m1 * block_scale`` (exact in bf16),
* accumulation is fp32,
* per-row global scales are applied to the fp32 accumulator,
* the only intermediate rounded to bf16 is the gated-MLP activation that feeds the down
  projection (the GPU kernels feed it to the tensor cores in bf16),
* the final output is rounded to bf16 once.
"""

from nvfp4_ops.reference.linear import linear_fp32, linear_reference
from nvfp4_ops.reference.mlp import clamped_swiglu, mlp_reference
from nvfp4_ops.reference.moe import moe_reference

__all__ = [
    "clamped_swiglu",
    "linear_fp32",
    "linear_reference",
    "mlp_reference",
    "moe_reference",
]
