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
per 16-byte block; :mod:`nvfp4_ops.orders.wfrag`), and the op is called with ``wfrag=True``.
``NVFP4_OPS_DENSE_WFRAG`` = ``auto`` (default: on CUDA) / ``1`` (also on CPU, where the
reference undoes it) / ``0`` (keep the checkpoint order). The kernels load each 16-byte block
straight into the registers the MMA reads and decode it with fewer instructions, which is
why the glue prepares the weights once at load time rather than per call (the measurements
are in the dense kernel's design notes).
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import (
    LinearMethodBase,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.parameter import ModelWeightParameter, PerTensorScaleParameter

import nvfp4_ops  # registers torch.ops.nvfp4.*
from model_glue.warm import warm_layer
from nvfp4_ops import _env
from nvfp4_ops.prepare import prepare_linear

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
        """Per-row global scales from the shards' ``weight_scale_2``, the weights checked once,
        the codes in the ``wfrag`` order on CUDA (:func:`nvfp4_ops.prepare.prepare_linear`;
        ``NVFP4_OPS_DENSE_WFRAG`` forces it either way); then, on CUDA, the layer's kernels
        warmed (:mod:`model_glue.warm`).

        Raises:
            nvfp4_ops.NVFP4InputError: a bad scale (``global_scale`` is the per-row expansion
                of ``weight_scale_2``), named with the layer.
        """
        where = f"nvfp4_ops linear {self.prefix} (global_scale = weight_scale_2)".strip()
        if not layer.weight.data.is_contiguous():
            layer.weight.data = layer.weight.data.contiguous()
        # in place, once per load (this method runs once after every weight load)
        per_row, layer.nvfp4_wfrag = prepare_linear(
            layer.weight.data, layer.weight_scale.data, layer.weight_scale_2.data,
            list(layer.logical_widths), wfrag=_env.auto_flag(_env.DENSE_WFRAG), where=where)
        del layer.weight_scale_2
        del layer.input_scale
        layer.register_parameter("weight_global",
                                 torch.nn.Parameter(per_row, requires_grad=False))
        warm_layer(self.describe(layer), layer.weight.device)

    @staticmethod
    def describe(layer) -> nvfp4_ops.LinearLayer:
        """The prepared layer as :func:`nvfp4_ops.warmup` takes it."""
        n, k = layer.weight.shape[0], layer.weight.shape[1] * 2
        return nvfp4_ops.LinearLayer(n, k, has_bias=getattr(layer, "bias", None) is not None,
                                     wfrag=getattr(layer, "nvfp4_wfrag", False))

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if x2.dtype != torch.bfloat16:
            x2 = x2.to(torch.bfloat16)
        out = nvfp4_ops.linear(x2, layer.weight, layer.weight_scale, layer.weight_global,
                               None if bias is None else bias.to(torch.bfloat16),
                               wfrag=getattr(layer, "nvfp4_wfrag", False))
        return out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)
