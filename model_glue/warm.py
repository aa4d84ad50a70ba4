"""Warm-up from the model: every layer the glue prepares warms its kernels at load time.

vLLM runs each quantization method's ``process_weights_after_loading`` once the checkpoint is
loaded, before it profiles memory and captures CUDA graphs. At the end of it the glue describes
the layer (:class:`nvfp4_ops.LinearLayer` ``(N, K, bias, wfrag)`` or
:class:`nvfp4_ops.MoELayer` ``(E, H, I, top_k, wperm)``) and, for weights on a CUDA device,
calls :func:`nvfp4_ops.warmup` with it (which skips what already ran: the decoder layers of
one model repeat a handful of sizes). So every kernel variant a forward can launch is compiled,
or loaded from the disk cache, and run once before the first request and before graph
capture; with ``NVFP4_OPS_NO_COMPILE_AFTER_WARMUP=1`` any later compile is an error naming the
kernel. Weights on the CPU, and ``NVFP4_OPS_BACKEND=reference``, warm nothing (the references
compile nothing).
"""

from __future__ import annotations

import time

import torch

import nvfp4_ops
from nvfp4_ops import _env

__all__ = ["warm_layer"]


def warm_layer(layer: nvfp4_ops.LinearLayer | nvfp4_ops.MoELayer, device: torch.device) -> bool:
    """Warm the kernels of one layer whose weights live on ``device``; True if any variant
    ran now (False: a CPU device, ``NVFP4_OPS_BACKEND=reference``, or all of them ran before).

    Raises:
        nvfp4_ops.NVFP4UnsupportedGPUError: the GPU is not a Hopper one (at load time, not at
            the first request).
    """
    if device.type != "cuda" or _env.backend() == "reference":
        return False  # the references compile nothing
    from vllm.logger import init_logger

    start = time.monotonic()
    # on the current device: the one vLLM's worker loaded this layer's weights onto
    names = nvfp4_ops.warmup(layers=[layer], run=True)
    if not names:
        return False
    init_logger("vllm.plugins.nvfp4_ops").info(
        "nvfp4_ops: %d kernel variants warmed for %s in %.1f s", len(names), layer,
        time.monotonic() - start)
    return True
