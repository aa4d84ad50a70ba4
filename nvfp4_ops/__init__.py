"""nvfp4-ops: NVFP4 weight-only (W4A16) ops for DeepSeek-V4 on Hopper GPUs.

Importing this package registers every ``torch.ops.nvfp4.*`` op (quantize, dequantize,
linear, mlp, moe, mxfp4_to_nvfp4, mxfp4_kernel_scales, to_wperm_, to_wfrag_) with its fake
and its pure-torch CPU reference. It initialises no CUDA and imports no GPU kernel code;
CUDA kernels are loaded on first use.
"""

from __future__ import annotations

from nvfp4_ops import format
from nvfp4_ops._device import NVFP4UnsupportedGPUError
from nvfp4_ops._env import NVFP4EnvError
from nvfp4_ops._validate import (
    NVFP4InputError,
    check_linear_weights,
    check_mlp_weights,
    check_moe_weights,
    set_value_checks,
)
from nvfp4_ops._warmup import LinearLayer, MLPLayer, MoELayer, warmup
from nvfp4_ops.ops import (
    dequantize,
    linear,
    mlp,
    moe,
    mxfp4_kernel_scales,
    mxfp4_to_nvfp4,
    quantize,
    to_wfrag_,
    to_wperm_,
)
from nvfp4_ops.prepare import prepare_linear, prepare_moe, prepare_mxfp4_moe
from nvfp4_ops.shapes import SHAPES, MoEShape, get_shape

__version__ = "0.1.0"

__all__ = [
    "LinearLayer",
    "MLPLayer",
    "MoELayer",
    "NVFP4EnvError",
    "NVFP4InputError",
    "NVFP4UnsupportedGPUError",
    "MoEShape",
    "SHAPES",
    "check_linear_weights",
    "check_mlp_weights",
    "check_moe_weights",
    "dequantize",
    "format",
    "get_shape",
    "linear",
    "mlp",
    "moe",
    "mxfp4_kernel_scales",
    "mxfp4_to_nvfp4",
    "prepare_linear",
    "prepare_moe",
    "prepare_mxfp4_moe",
    "quantize",
    "set_value_checks",
    "to_wfrag_",
    "to_wperm_",
    "warmup",
]
