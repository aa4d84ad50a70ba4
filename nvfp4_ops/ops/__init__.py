"""One module per op: schema + fake + CPU reference + CUDA dispatch + public wrapper.

Importing this package registers every ``torch.ops.nvfp4.*`` op.
"""

from nvfp4_ops.ops.linear import linear
from nvfp4_ops.ops.mlp import mlp
from nvfp4_ops.ops.moe import moe
from nvfp4_ops.ops.mxfp4 import mxfp4_kernel_scales, mxfp4_to_nvfp4
from nvfp4_ops.ops.quantize import dequantize, quantize
from nvfp4_ops.ops.wfrag import to_wfrag_
from nvfp4_ops.ops.wperm import to_wperm_

__all__ = ["dequantize", "linear", "mlp", "moe", "mxfp4_kernel_scales", "mxfp4_to_nvfp4",
           "quantize", "to_wfrag_", "to_wperm_"]
