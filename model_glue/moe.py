"""Routed experts of DeepSeek-V4 checkpoints on ``torch.ops.nvfp4.moe``: NVFP4 (NVIDIA's
ModelOpt exports) and MXFP4 (DeepSeek's own releases).

Both methods keep vLLM's own parameters for the format (names, shapes, dtypes, loader
attributes), so vLLM's ``RoutedExperts.weight_loader`` fills them from the checkpoint
unchanged, and both call ``nvfp4::moe`` with vLLM's routing.

**NVFP4** (:class:`ModelOptNvFp4OpsFusedMoE`, the parameters of vLLM's
``ModelOptNvFp4FusedMoE``):

=====================  =================  ================  ===============================
parameter              dtype              shape             after process_weights_after_...
=====================  =================  ================  ===============================
``w13_weight``         ``uint8``          ``[E, 2I, H/2]``  kept: gate rows, then up rows [*]
``w13_weight_scale``   ``float8_e4m3fn``  ``[E, 2I, H/16]`` kept
``w13_weight_scale_2`` ``float32``        ``[E, 2]``        kept: (gate, up), both applied
``w2_weight``          ``uint8``          ``[E, H, I/2]``   kept [*]
``w2_weight_scale``    ``float8_e4m3fn``  ``[E, H, I/16]``  kept
``w2_weight_scale_2``  ``float32``        ``[E]``           kept
``w13_input_scale``    ``float32``        ``[E, 2]``        freed (W4A16 needs no act scale)
``w2_input_scale``     ``float32``        ``[E]``           freed
=====================  =================  ================  ===============================

The checkpoint layout *is* a layout ``nvfp4::moe`` takes, so post-load processing validates
and frees, and no repacked copy is ever made (no doubled weight memory).

**MXFP4** (:class:`Mxfp4OpsFusedMoE`, the parameters of vLLM's ``Mxfp4MoEMethod``: e2m1 codes
and one UE8M0 scale byte per 32 k, no global scale):

=====================  =================  ================  ===============================
parameter              dtype              shape             after process_weights_after_...
=====================  =================  ================  ===============================
``w13_weight``         ``uint8``          ``[E, 2I, H/2]``  kept: gate rows, then up rows [*]
``w13_weight_scale``   ``uint8`` (e8m0)   ``[E, 2I, H/32]`` -> ``float8_e8m0fnu [E, 2I, H/32]``
                                                            (CPU: ``float8_e4m3fn [E, 2I, H/16]``)
(new)                                                       ``w13_weight_global f32 [E, 2]``
                                                            (or ``[E, 2I]``: one per row)
``w2_weight``          ``uint8``          ``[E, H, I/2]``   kept [*]
``w2_weight_scale``    ``uint8`` (e8m0)   ``[E, H, I/32]``  -> ``float8_e8m0fnu [E, H, I/32]``
                                                            (CPU: ``float8_e4m3fn [E, H, I/16]``)
(new)                                                       ``w2_weight_global f32 [E]``
                                                            (or ``[E, H]``: one per row)
=====================  =================  ================  ===============================

MXFP4 codes are NVFP4 codes, so they stay where the loader put them. On CUDA, at the sizes the
MoE kernels read MXFP4 scales at (``nvfp4_ops.prepare.moe_mx_supported``: V4-Flash and V4-Pro),
the scales stay one UE8M0 byte per 32 k, rebased per row by ``nvfp4::mxfp4_kernel_scales``
(``float8_e8m0fnu`` of the same shape plus one power-of-two global scale per row), then to one
global scale per expert half where the kernels' window holds the half (every real checkpoint;
``nvfp4_ops.format.mxfp4_group_globals``), which the kernels read as they are. Elsewhere (and
with ``NVFP4_OPS_MXFP4_SCALES=convert``) they are converted by ``nvfp4::mxfp4_to_nvfp4``
(per-row global scales, e4m3 power-of-two block scales per 16). Both are **exact** (the
dequantized weights are bitwise the MXFP4 ones) and free the e8m0 tensors; the two forms give
bitwise the same output. A row whose non-zero blocks span more than 126 binades (converted: 18)
cannot be held and stops loading with an error naming the layer, the tensor, the row and the
block. The e8m0 scales start as 0xFF (the UE8M0 NaN code), so a scale the checkpoint never
provided fails the conversion loudly instead of running on zeros. ``NVFP4_OPS_MXFP4=0`` keeps
vLLM's own ``Mxfp4MoEMethod`` for these layers (:mod:`model_glue.configs`).

[*] On CUDA, where the MoE kernels read it (``nvfp4_ops.prepare.moe_wperm_supported``: V4-Flash
and V4-Pro sizes), the codes of ``w13_weight`` / ``w2_weight`` are then permuted **in place**
into the ``wperm`` bit order (``nvfp4::to_wperm_``, :mod:`nvfp4_ops.orders.wperm`: same bytes
per u32 word, bits moved, decoded with fewer instructions) and the op is called with
``wperm=True``. The environment variable ``NVFP4_OPS_MOE_WPERM`` = ``auto`` (default) / ``1``
(also on CPU, where the reference undoes it per call) / ``0`` (keep the checkpoint order)
overrides the choice.

The NVFP4 class name contains ``ModelOpt`` on purpose: vLLM 0.33's
``RoutedExperts.weight_loader`` routes per-tensor ``weight_scale_2``/``input_scale`` loading by
that substring. The MXFP4 class name must not contain it: its scales load through the loader's
block-scale branch (``quant_method = "block"`` on the parameter, as vLLM's MXFP4 method sets).

Routing stays vLLM's. vLLM's router already multiplies ``topk_weights`` by
``routed_scaling_factor`` (``FusedMoEFactory`` hands the factor to the router unless
``apply_routed_scale_to_output`` is set, and in that case the runner scales the output), so
the op is called with ``output_scale=1.0`` either way.
"""

from __future__ import annotations

import torch
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4FusedMoE
from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod

import nvfp4_ops  # registers torch.ops.nvfp4.*
from model_glue.warm import warm_layer
from nvfp4_ops import _env
from nvfp4_ops.format import UE8M0_NAN
from nvfp4_ops.prepare import prepare_moe, prepare_mxfp4_moe

__all__ = ["ModelOptNvFp4OpsFusedMoE", "Mxfp4OpsFusedMoE"]

logger = init_logger(__name__)


def _check_supported(moe_config, what: str) -> None:
    """``nvfp4::moe`` computes ``down(silu(min(gate, L)) * clamp(up, -L, L))`` without biases."""
    if not moe_config.is_act_and_mul or moe_config.activation != MoEActivation.SILU:
        raise NotImplementedError(
            f"nvfp4_ops MoE ({what}): only gated SiLU (SwiGLU) experts are supported, got "
            f"activation {moe_config.activation}")
    if moe_config.has_bias:
        raise NotImplementedError(f"nvfp4_ops MoE ({what}): experts with biases are not "
                                  "supported")


class _OpsFusedMoE:
    """What both methods share: vLLM's fused-MoE interface around ``nvfp4::moe``.

    A mixin placed before vLLM's method class in the bases. A subclass says where its global
    scales live (:meth:`_global_scales`), prepares its weights with :mod:`nvfp4_ops.prepare`
    and calls :meth:`_setup_expert_range`, then :meth:`_warm`, at the end of its
    ``process_weights_after_loading``.
    """

    def _init_ops_state(self) -> None:
        self.expert_start = 0
        self.global_to_local: torch.Tensor | None = None
        #: the layer's w13 / w2 codes are in the ``wperm`` bit order (module docstring)
        self.wperm = False

    # --- what vLLM asks of a fused-MoE method -------------------------------------------

    @property
    def is_monolithic(self) -> bool:
        return False  # vLLM routes; apply() gets topk ids/weights

    @property
    def supports_eplb(self) -> bool:
        return False  # EPLB's physical replicas are not mapped yet (README: known limits)

    @property
    def topk_indices_dtype(self) -> torch.dtype | None:
        return None  # int32 or int64 both accepted by nvfp4::moe

    def get_fused_moe_quant_config(self, layer) -> None:
        return None  # no modular kernel behind this method

    # --- shared post-load steps -----------------------------------------------------------

    @staticmethod
    def _where(layer, fmt: str) -> str:
        return f"nvfp4_ops {fmt} MoE {getattr(layer, 'layer_name', '')}".rstrip()

    def _global_scales(self, layer) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    @staticmethod
    def _contiguous(layer, *names: str) -> None:
        for name in names:
            p = getattr(layer, name)
            if not p.data.is_contiguous():
                p.data = p.data.contiguous()

    @staticmethod
    def _wperm_wanted() -> bool | None:
        """``NVFP4_OPS_MOE_WPERM``: ``auto`` (None: on CUDA where the MoE kernels read the
        ``wperm`` order), or a boolean that forces it."""
        return _env.auto_flag(_env.MOE_WPERM)

    def describe(self, layer) -> nvfp4_ops.MoELayer:
        """The prepared layer as :func:`nvfp4_ops.warmup` takes it."""
        w13 = layer.w13_weight
        return nvfp4_ops.MoELayer(experts=w13.shape[0], hidden=w13.shape[2] * 2,
                                  inter=w13.shape[1] // 2, top_k=self.moe.experts_per_token,
                                  wperm=self.wperm,
                                  mx=layer.w13_weight_scale.dtype == torch.float8_e8m0fnu)

    def _warm(self, layer) -> None:
        """Warm this layer's kernels on CUDA (:mod:`model_glue.warm`); the last post-load step."""
        warm_layer(self.describe(layer), layer.w13_weight.device)

    def _setup_expert_range(self, layer) -> None:
        """EP: the op takes GLOBAL ids plus the first global id of a contiguous local range.

        vLLM's linear placement gives exactly that; any other placement (round robin) is
        served by remapping ids through ``expert_map`` (non-local ids -> an out-of-range
        local id, which contributes 0) on each call.
        """
        expert_map = layer.expert_map
        num_local = layer.w13_weight.shape[0]
        self.expert_start, self.global_to_local = 0, None
        if expert_map is None:
            return
        emap = expert_map.cpu()
        local_globals = (emap >= 0).nonzero().flatten()
        if local_globals.numel() != num_local:
            raise RuntimeError(
                f"nvfp4_ops MoE: expert_map owns {local_globals.numel()} experts, the layer "
                f"holds {num_local}"
            )
        start = int(local_globals[0]) if num_local else 0
        contiguous = torch.equal(emap[local_globals], local_globals - start) and (
            num_local == 0 or int(local_globals[-1]) - start + 1 == num_local
        )
        if contiguous:
            self.expert_start = start
        else:
            table = torch.where(emap >= 0, emap, torch.full_like(emap, num_local))
            self.global_to_local = table.to(device=layer.w13_weight.device, dtype=torch.int32)

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        # Shared experts: with no modular kernel here, vLLM's runner runs them itself.
        ids, start, num_global = topk_ids, self.expert_start, layer.global_num_experts
        if self.global_to_local is not None:
            ids, start, num_global = self.global_to_local[topk_ids.long()], 0, -1
        w13_global, w2_global = self._global_scales(layer)
        # the public wrapper: torch.ops.nvfp4.moe under torch.compile / export, the same CUDA
        # implementation without the dispatcher's Python layers in a plain eager call
        return nvfp4_ops.moe(
            x, ids, topk_weights.float(), layer.w13_weight, layer.w13_weight_scale, w13_global,
            layer.w2_weight, layer.w2_weight_scale, w2_global, expert_start=start,
            global_num_experts=num_global,
            swiglu_limit=None if layer.swiglu_limit is None else float(layer.swiglu_limit),
            output_scale=1.0, wperm=self.wperm)

    def apply_monolithic(self, layer, x, router_logits, input_ids=None):
        raise NotImplementedError("nvfp4_ops MoE is not monolithic")


class ModelOptNvFp4OpsFusedMoE(_OpsFusedMoE, ModelOptNvFp4FusedMoE):
    """vLLM fused-MoE method: NVFP4 (ModelOpt layout) routed experts via ``nvfp4::moe``.

    Weight-only (W4A16): activations stay bf16; ``input_scale`` tensors are loaded (the
    checkpoint has them) and then freed.
    """

    def __init__(self, quant_config, moe_config) -> None:
        # vLLM's __init__ selects a CUDA NVFP4 backend (and fails where none fits); ours has
        # no backend to choose, so only the base-class state and the attributes the
        # inherited create_weights / weight loader read are set here.
        FusedMoEMethodBase.__init__(self, moe_config)
        self.quant_config = quant_config
        self.use_a16 = True
        self.per_token_activation = False
        self.use_global_sf = False  # input scales are per local expert
        self.nvfp4_backend = None
        self.experts_cls = None
        self._init_ops_state()
        _check_supported(moe_config, "NVFP4")

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition,
                       params_dtype, **extra_weight_attrs):
        super().create_weights(layer, num_experts, hidden_size, intermediate_size_per_partition,
                               params_dtype, **extra_weight_attrs)
        # NaN until loaded, so a scale the checkpoint lacks fails validation loudly instead
        # of running with torch.empty garbage. (Dummy loading overwrites these as usual.)
        layer.w13_weight_scale_2.data.fill_(float("nan"))
        layer.w2_weight_scale_2.data.fill_(float("nan"))

    def process_weights_after_loading(self, layer) -> None:
        """Check the weights once and, on CUDA where the kernels read it, put the codes in the
        ``wperm`` order in place (:func:`nvfp4_ops.prepare.prepare_moe`).

        Raises:
            nvfp4_ops.NVFP4InputError: a bad scale (NaN or negative block scale, non-positive
                or non-finite ``weight_scale_2``, e.g. one the checkpoint never provided); the
                message names the layer and the op argument (``w13_global`` is
                ``w13_weight_scale_2``, ``w2_global`` is ``w2_weight_scale_2``).
        """
        where = (f"{self._where(layer, 'NVFP4')} (w13_global = w13_weight_scale_2, "
                 "w2_global = w2_weight_scale_2)")
        self._contiguous(layer, "w13_weight", "w2_weight", "w13_weight_scale",
                         "w13_weight_scale_2", "w2_weight_scale", "w2_weight_scale_2")
        # W4A16: the activation scales are never used; drop them (and their memory).
        for name in ("w13_input_scale", "w2_input_scale"):
            if hasattr(layer, name):
                delattr(layer, name)
        self.wperm = prepare_moe(
            layer.w13_weight.data, layer.w13_weight_scale.data, layer.w13_weight_scale_2.data,
            layer.w2_weight.data, layer.w2_weight_scale.data, layer.w2_weight_scale_2.data,
            wperm=self._wperm_wanted(), where=where)
        self._setup_expert_range(layer)
        self._warm(layer)

    def _global_scales(self, layer) -> tuple[torch.Tensor, torch.Tensor]:
        return layer.w13_weight_scale_2, layer.w2_weight_scale_2


class Mxfp4OpsFusedMoE(_OpsFusedMoE, FusedMoEMethodBase):
    """vLLM fused-MoE method: MXFP4 routed experts (DeepSeek's releases) via ``nvfp4::moe``,
    after an exact load-time conversion of their scales to NVFP4 (module docstring).

    Weight-only (W4A16): activations stay bf16 (vLLM's own MXFP4 method on Hopper is also
    weight-only).
    """

    def __init__(self, moe_config) -> None:
        # Not a subclass of vLLM's Mxfp4MoEMethod: its __init__ and most of its methods serve
        # the backend it selects. Only its create_weights is reused (below), which is what
        # makes the checkpoint load into the parameters vLLM's loader expects.
        FusedMoEMethodBase.__init__(self, moe_config)
        self._init_ops_state()
        _check_supported(moe_config, "MXFP4")

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition,
                       params_dtype, **extra_weight_attrs):
        """vLLM's MXFP4 parameters, exactly as ``Mxfp4MoEMethod.create_weights`` makes them:
        ``w13_weight`` / ``w2_weight`` uint8 codes and ``w13_weight_scale`` /
        ``w2_weight_scale`` uint8 UE8M0 bytes (``quant_method = "block"``, loaded through
        vLLM's e8m0 -> uint8 scale loader). The scales start as 0xFF (NaN): one the checkpoint
        does not provide then fails the conversion instead of reading as 2^-127."""
        Mxfp4MoEMethod.create_weights(self, layer, num_experts, hidden_size,
                                      intermediate_size_per_partition, params_dtype,
                                      **extra_weight_attrs)
        layer.w13_weight_scale.data.fill_(UE8M0_NAN)
        layer.w2_weight_scale.data.fill_(UE8M0_NAN)

    def process_weights_after_loading(self, layer) -> None:
        """Rebase the e8m0 scales into the kernels' UE8M0 form (or convert them to NVFP4
        block scales: :func:`nvfp4_ops.prepare_mxfp4_moe`) plus their global scales (exact;
        the checkpoint's e8m0 tensors are freed), then prepare the codes as the NVFP4 method
        does.

        Raises:
            nvfp4_ops.NVFP4InputError: a NaN (or never loaded) scale, or a weight row whose
                non-zero blocks span more than the form holds (126 binades native, 18
                converted); the message names the layer, the
                parameter, the row (local expert, row) and the block.
        """
        where = self._where(layer, "MXFP4")
        inter = layer.w13_weight.shape[1] // 2
        self._contiguous(layer, "w13_weight", "w2_weight")
        block13, global13, block2, global2, self.wperm = prepare_mxfp4_moe(
            layer.w13_weight.data, layer.w13_weight_scale.data, layer.w2_weight.data,
            layer.w2_weight_scale.data, wperm=self._wperm_wanted(),
            where=f"{where} ({_env.MXFP4}=0 keeps vLLM's MXFP4 method)",
            names=(f"w13_weight_scale [E, 2I, H/32] (rows 0..{inter - 1} = w1, {inter}.. = w3)",
                   "w2_weight_scale [E, H, I/32]"))
        # Replacing the parameters drops the last references to the e8m0 bytes.
        for stem, block, global_scale in (("w13", block13, global13), ("w2", block2, global2)):
            delattr(layer, f"{stem}_weight_scale")
            layer.register_parameter(f"{stem}_weight_scale",
                                     torch.nn.Parameter(block, requires_grad=False))
            layer.register_parameter(f"{stem}_weight_global",
                                     torch.nn.Parameter(global_scale, requires_grad=False))
        self._setup_expert_range(layer)
        self._warm(layer)

    def _global_scales(self, layer) -> tuple[torch.Tensor, torch.Tensor]:
        return layer.w13_weight_global, layer.w2_weight_global
