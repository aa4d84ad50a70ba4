"""NVFP4 linear layers of ModelOpt checkpoints on ``torch.ops.nvfp4.linear`` (W4A16).

Parameters (per layer; ``N`` = sum of this rank's output shards, ``S`` = number of shards of a
fused projection, e.g. 2 for ``fused_wqa_wkv`` / ``gate_up_proj``):

==================  =================  =============  ========================================
parameter           dtype              shape          after process_weights_after_loading
==================  =================  =============  ========================================
``weight``          ``uint8``          ``[N, K/2]``   kept
``weight_scale``    ``float8_e4m3fn``  ``[N, K/16]``  kept
``weight_scale_2``  ``float32``        ``[S]``        -> ``weight_global`` ``float32 [N]``
``input_scale``     ``float32``        ``[S]``        freed (activations stay bf16)
==================  =================  =============  ========================================

**Fused projections stay exact.** vLLM's loader writes each shard's ``weight_scale_2`` into its
own slot of the ``[S]`` buffer (``PerTensorScaleParameter``), whatever order the shards arrive
in. Only after every shard has loaded does :meth:`process_weights_after_loading` expand the
``S`` scales to one fp32 scale per output row; ``nvfp4::linear`` applies that per-row scale to
the fp32 accumulator. Nothing is folded into the e4m3 block scales (that would round), and no
shard is rescaled to a shared maximum (vLLM's stock NVFP4 linear takes the max and warns).

**Prepared weight order.** On CUDA the codes of ``weight`` are
then permuted **in place** into the order every dense GPU kernel reads with natural
activations (``nvfp4::to_wfrag_``: MMA-fragment order plus the ``wperm`` bit order, same bytes
per 16-byte block; :mod:`nvfp4_ops.kernels.wfrag`), and the op is called with ``wfrag=True``.
``NVFP4_OPS_DENSE_WFRAG`` = ``auto`` (default: on CUDA) / ``1`` (also on CPU, where the
reference undoes it) / ``0`` (keep the checkpoint order). The kernels load each 16-byte block
straight into the registers the MMA reads and decode it with fewer instructions, which is
why the glue prepares the weights once at load time rather than per call (the measurements
are in the dense kernel's design notes).
"""

from __future__ import annotations

import os

import torch
from vllm.model_executor.layers.linear import (
    LinearMethodBase,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.parameter import ModelWeightParameter, PerTensorScaleParameter

import nvfp4_ops  # registers torch.ops.nvfp4.*
from model_glue.moe import check_block_scales, check_global_scales

__all__ = ["Nvfp4OpsLinearMethod"]

GROUP_SIZE = 16
K_ALIGN = 32  # nvfp4::linear needs K % 32 == 0


@register_weight_loader_v2_supported_method
class Nvfp4OpsLinearMethod(LinearMethodBase):
    """vLLM linear method: ModelOpt NVFP4 weights, bf16 activations, ``nvfp4::linear``."""

    def __init__(self, prefix: str = "") -> None:
        super().__init__()
        self.prefix = prefix

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes,
                       input_size, output_size, params_dtype, **extra_weight_attrs):
        if input_size_per_partition % K_ALIGN:
            raise ValueError(
                f"nvfp4_ops linear {self.prefix}: input features per partition "
                f"({input_size_per_partition}) must be a multiple of {K_ALIGN}"
            )
        weight_loader = extra_weight_attrs.get("weight_loader")
        n = sum(output_partition_sizes)
        shards = len(output_partition_sizes)
        layer.logical_widths = list(output_partition_sizes)
        layer.input_size_per_partition = input_size_per_partition
        layer.output_size_per_partition = n

        weight = ModelWeightParameter(
            data=torch.empty(n, input_size_per_partition // 2, dtype=torch.uint8),
            input_dim=1, output_dim=0, weight_loader=weight_loader)
        layer.register_parameter("weight", weight)
        # NaN sentinels: a scale the checkpoint never provided fails validation after loading.
        weight_scale = ModelWeightParameter(
            data=torch.full((n, input_size_per_partition // GROUP_SIZE), float("nan"),
                            dtype=torch.float8_e4m3fn),
            input_dim=1, output_dim=0, weight_loader=weight_loader)
        layer.register_parameter("weight_scale", weight_scale)
        weight_scale_2 = PerTensorScaleParameter(
            data=torch.full((shards,), float("nan"), dtype=torch.float32),
            weight_loader=weight_loader)
        layer.register_parameter("weight_scale_2", weight_scale_2)
        input_scale = PerTensorScaleParameter(
            data=torch.ones(shards, dtype=torch.float32), weight_loader=weight_loader)
        layer.register_parameter("input_scale", input_scale)

    def process_weights_after_loading(self, layer) -> None:
        where = f"nvfp4_ops linear {self.prefix}".rstrip()
        check_global_scales(where, "weight_scale_2 (one per shard)", layer.weight_scale_2.data)
        check_block_scales(where, "weight_scale", layer.weight_scale.data)
        widths = torch.tensor(layer.logical_widths, device=layer.weight_scale_2.device)
        per_row = torch.repeat_interleave(layer.weight_scale_2.data.float(), widths)
        del layer.weight_scale_2
        del layer.input_scale
        layer.register_parameter(
            "weight_global", torch.nn.Parameter(per_row.contiguous(), requires_grad=False))
        layer.nvfp4_wfrag = False
        if _wfrag_wanted(layer.weight):
            if not layer.weight.data.is_contiguous():
                layer.weight.data = layer.weight.data.contiguous()
            # in place, once per load (this method runs once after every weight load)
            nvfp4_ops.to_wfrag_(layer.weight.data)
            layer.nvfp4_wfrag = True

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if x2.dtype != torch.bfloat16:
            x2 = x2.to(torch.bfloat16)
        out = torch.ops.nvfp4.linear(x2, layer.weight, layer.weight_scale, layer.weight_global,
                                     None if bias is None else bias.to(torch.bfloat16),
                                     getattr(layer, "nvfp4_wfrag", False))
        return out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)


def _wfrag_wanted(weight: torch.Tensor) -> bool:
    """``NVFP4_OPS_DENSE_WFRAG``: ``auto`` (default): on CUDA; ``1``: always; ``0``: never.
    (Every layer this method builds has ``K % 32 == 0``, checked in ``create_weights``, which
    is all ``to_wfrag_`` needs.)"""
    mode = os.environ.get("NVFP4_OPS_DENSE_WFRAG", "auto").strip().lower()
    if mode not in ("auto", "1", "0"):
        raise ValueError(f"NVFP4_OPS_DENSE_WFRAG must be auto, 1 or 0, got {mode!r}")
    if mode != "auto":
        return mode == "1"
    return weight.is_cuda
