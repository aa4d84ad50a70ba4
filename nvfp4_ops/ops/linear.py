"""``nvfp4::linear``: ``y[M, N] = x[M, K] @ dequant(W)[N, K]^T (+ bias)``, W4A16.

CPU: the pure-torch reference (:func:`nvfp4_ops.reference.linear_reference`).
CUDA: the kernel :func:`nvfp4_ops.kernels.cuda_kernel` returns for ``"linear"`` (Hopper only,
:mod:`nvfp4_ops._device`); sizes its kernels do not cover run the reference on the GPU.

Per call only metadata is checked (:mod:`nvfp4_ops._validate`); the weights' values are
checked once at load with :func:`nvfp4_ops.check_linear_weights`.
"""

from __future__ import annotations

import torch

from nvfp4_ops import _device, kernels
from nvfp4_ops._library import qualname
from nvfp4_ops._validate import check_linear_meta, check_weight_values, value_checks_enabled
from nvfp4_ops.ops import _eager
from nvfp4_ops.reference import linear_reference

__all__ = ["linear"]


def _check(x, weight, weight_scale, global_scale, bias) -> None:
    check_linear_meta(x, weight, weight_scale, global_scale, bias)
    if value_checks_enabled(x):  # opt-in debugging: reads the scales (a host sync)
        check_weight_values("nvfp4.linear", {"weight_scale": weight_scale},
                            {"global_scale": global_scale})


@torch.library.custom_op(qualname("linear"), mutates_args=())
def _linear_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
    wfrag: bool = False,
) -> torch.Tensor:
    _check(x, weight, weight_scale, global_scale, bias)
    return linear_reference(x, weight, weight_scale, global_scale, bias, wfrag=wfrag)


#: launches of calls that repeat a checked one (same weights, same metadata; _eager.Repeats)
_repeats = _eager.Repeats()


@_linear_op.register_kernel("cuda")
def _linear_cuda(x, weight, weight_scale, global_scale, bias, wfrag=False):
    weights = (weight, weight_scale, global_scale, bias)
    launch = _repeats.find((x,), weights, (wfrag,))
    if launch is not None:  # repeats a call that passed every check below
        return launch(x)
    _check(x, weight, weight_scale, global_scale, bias)
    _device.require_supported_gpu(x.device)
    prepare = kernels.cuda_kernel("linear")
    launch = None if prepare is None else prepare(x, weight, weight_scale, global_scale, bias,
                                                  wfrag=wfrag)
    if launch is None:  # the reference is forced, or no kernel covers these sizes
        return linear_reference(x, weight, weight_scale, global_scale, bias, wfrag=wfrag)
    _repeats.keep((x,), weights, (wfrag,), launch)
    return launch(x)


@_linear_op.register_fake
def _(x, weight, weight_scale, global_scale, bias, wfrag=False):
    check_linear_meta(x, weight, weight_scale, global_scale, bias)
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.bfloat16)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    wfrag: bool = False,
) -> torch.Tensor:
    """NVFP4 weight-only linear (``torch.ops.nvfp4.linear``).

    Only metadata is checked per call. The scale values (``weight_scale`` without NaN or
    negative entries, ``global_scale`` finite and > 0) are not read per call: check them
    once with :func:`nvfp4_ops.check_linear_weights` when the weights are loaded
    (``NVFP4_OPS_VALUE_CHECKS=1`` re-checks them on every eager call, for debugging).

    Args:
        x: ``bf16 [M, K]``, contiguous, ``K % 32 == 0``; ``M`` may be 0.
        weight: ``uint8 [N, K/2]``, two e2m1 codes per byte, low nibble = even k.
        weight_scale: ``float8_e4m3fn [N, K/16]`` (or its bytes as ``uint8``), row-major
            (not swizzled).
        global_scale: ``float32 []`` or ``[N]`` (one per output row, so fused projections
            whose shards have different ``weight_scale_2`` stay exact); finite, > 0.
        bias: optional ``bf16 [N]``.
        wfrag: ``weight`` was prepared by :func:`nvfp4_ops.to_wfrag_` (what the vLLM glue
            does on CUDA): codes in MMA-fragment order and the ``wperm`` bit order, which every
            GPU kernel family reads with natural-order ``x``. Same result up to fp32 summation
            order (bitwise the same on the CPU reference, which undoes it).

    Returns:
        ``bf16 [M, N]`` = ``bf16((x @ (e2m1 * weight_scale)^T) * global_scale + bias)``,
        accumulated in fp32.

    Raises:
        NVFP4InputError: wrong dtype, shape, device or alignment; with
            ``NVFP4_OPS_VALUE_CHECKS=1`` also bad scale values.
        NVFP4UnsupportedGPUError: CUDA tensors on a GPU other than Hopper (see
            :mod:`nvfp4_ops._device`).
    """
    if _eager.direct(x, weight, weight_scale, global_scale, bias):
        # a plain eager CUDA call: skip the dispatcher's Python layers (same implementation)
        return _linear_cuda(x, weight, weight_scale, global_scale, bias, wfrag)
    return torch.ops.nvfp4.linear(x, weight, weight_scale, global_scale, bias, wfrag)
