"""vLLM quantization configs that hand DeepSeek-V4's NVFP4 and MXFP4 layers to the nvfp4 ops.

Both are subclasses of the config vLLM itself would pick, registered under the same name with
vLLM's ``register_quantization_config`` (a registered name wins over the built-in one). They
parse the checkpoint exactly as vLLM does (inherited ``from_config`` /
``override_quantization_method``) and change only which *method* object a layer gets:

* ``deepseek_v4_fp8`` (``quant_method: fp8``; ``expert_dtype: "fp4"`` routed experts):
  routed experts that vLLM would give ``ModelOptNvFp4FusedMoE`` (``moe_quant_algo: NVFP4``,
  NVIDIA's exports) get :class:`~model_glue.moe.ModelOptNvFp4OpsFusedMoE`; routed experts that
  vLLM would give ``Mxfp4MoEMethod`` (no NVFP4 ``moe_quant_algo``: DeepSeek's own releases,
  and the layers an NVIDIA export keeps in MXFP4 through its ``ignore`` list) get
  :class:`~model_glue.moe.Mxfp4OpsFusedMoE`, unless ``NVFP4_OPS_MXFP4=0``. Block-FP8 linears,
  FP8 experts (``expert_dtype: "fp8"``), skipped layers and everything else stay vLLM's.
* ``modelopt_fp4`` (``quant_method: modelopt``, ``quant_algo: NVFP4`` / ``W4A16_NVFP4``): for
  DeepSeek-V4 models only, routed experts get the same MoE method and quantized linear layers
  get :class:`~model_glue.linear.Nvfp4OpsLinearMethod`. Excluded layers, the KV-cache method
  and every other model family stay vLLM's.
"""

from __future__ import annotations

from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config
from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

from model_glue._env import flag
from model_glue.linear import Nvfp4OpsLinearMethod
from model_glue.moe import ModelOptNvFp4OpsFusedMoE, Mxfp4OpsFusedMoE

__all__ = ["DEEPSEEK_V4_MODEL_TYPES", "MXFP4_SWITCH", "make_deepseek_v4_fp8_config",
           "mxfp4_enabled", "Nvfp4OpsModelOptConfig"]

#: ``0`` keeps vLLM's own Mxfp4MoEMethod for MXFP4 routed experts (default: ours).
MXFP4_SWITCH = "NVFP4_OPS_MXFP4"

DEEPSEEK_V4_MODEL_TYPES = ("deepseek_v4", "deepseek_v4_text", "deepseek_v41",
                           "deepseek_v41_text")

# vLLM's ModelOpt config keeps these unquantized regardless of the exclude list.
_VISION_PREFIXES = ("vision_tower", "vision_model", "vit_large_projector")
# Read directly by DeepSeek-V4's fused FP8 output projection (nvidia/ops/o_proj.py).
_FP8_ONLY_ATTENTION = (".attn.wo_a", ".attn.wo_b")


def _current_model_type() -> str | None:
    from vllm.config import get_current_vllm_config_or_none

    vc = get_current_vllm_config_or_none()
    if vc is None or vc.model_config is None:
        return None
    return getattr(vc.model_config.hf_config, "model_type", None)


def mxfp4_enabled() -> bool:
    """``NVFP4_OPS_MXFP4`` (default on): whether MXFP4 routed experts get the nvfp4 ops."""
    return flag(MXFP4_SWITCH, True)


def make_deepseek_v4_fp8_config(base: type) -> type:
    """A subclass of vLLM's ``DeepseekV4FP8Config`` (``base``: the class vLLM selects on this
    platform) whose NVFP4 and MXFP4 routed experts use ``nvfp4::moe``."""

    class Nvfp4OpsDeepseekV4FP8Config(base):
        def _fp4_expert_format(self, layer, prefix: str) -> str | None:
            """``"nvfp4"`` / ``"mxfp4"`` where vLLM's config would build
            ``ModelOptNvFp4FusedMoE`` / ``Mxfp4MoEMethod`` for this layer, else None: the same
            decision, asked through vLLM's own helpers (and never by building vLLM's methods,
            whose constructors select CUDA backends)."""
            if not isinstance(layer, RoutedExperts):
                return None
            if is_layer_skipped(prefix=prefix, ignored_layers=self.ignored_layers,
                                fused_mapping=self.packed_modules_mapping):
                return None  # vLLM: unquantized experts
            if self.expert_dtype != "fp4":
                return None  # vLLM: block-FP8 experts (Fp8MoEMethod)
            if hasattr(self, "_is_nvfp4_expert_layer"):  # vLLM's V4.1 config
                nvfp4 = self._is_nvfp4_expert_layer(prefix)
            else:
                nvfp4 = self.moe_quant_algo == "NVFP4"
            return "nvfp4" if nvfp4 else "mxfp4"

        def get_quant_method(self, layer, prefix):
            fp4 = self._fp4_expert_format(layer, prefix)
            if fp4 == "nvfp4":
                return ModelOptNvFp4OpsFusedMoE(quant_config=self._get_nvfp4_config(),
                                                moe_config=layer.moe_config)
            if fp4 == "mxfp4" and mxfp4_enabled():
                return Mxfp4OpsFusedMoE(layer.moe_config)
            return super().get_quant_method(layer, prefix)

    Nvfp4OpsDeepseekV4FP8Config.__qualname__ = Nvfp4OpsDeepseekV4FP8Config.__name__
    Nvfp4OpsDeepseekV4FP8Config.__module__ = __name__
    return Nvfp4OpsDeepseekV4FP8Config


class Nvfp4OpsModelOptConfig(ModelOptNvFp4Config):
    """vLLM's ModelOpt NVFP4 config; DeepSeek-V4's NVFP4 experts and linears use nvfp4 ops."""

    def get_quant_method(self, layer, prefix):
        if _current_model_type() not in DEEPSEEK_V4_MODEL_TYPES:
            return super().get_quant_method(layer, prefix)
        is_ours = isinstance(layer, (RoutedExperts, LinearBase))
        # Exclusions and the vision tower are vLLM's call, asked before any method is built
        # (vLLM's own NVFP4 methods select CUDA backends in their constructors).
        if (not is_ours or self.is_layer_excluded(prefix)
                or any(v in prefix for v in _VISION_PREFIXES)
                or not self.is_checkpoint_nvfp4_serialized):
            return super().get_quant_method(layer, prefix)
        if isinstance(layer, RoutedExperts):
            return ModelOptNvFp4OpsFusedMoE(quant_config=self, moe_config=layer.moe_config)
        if prefix.endswith(_FP8_ONLY_ATTENTION):
            raise NotImplementedError(
                f"{prefix}: vLLM 0.33's DeepSeek-V4 attention feeds wo_a/wo_b straight to its "
                "block-FP8 output-projection kernel, never through a linear method, so an "
                "NVFP4 wo_a/wo_b cannot be served (by vLLM or by nvfp4_ops). Use a checkpoint "
                "that keeps them FP8/BF16 (ModelOpt: add them to exclude_modules).")
        return Nvfp4OpsLinearMethod(prefix)
