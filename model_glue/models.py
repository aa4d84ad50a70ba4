"""DeepSeek-V4 model class that also loads HuggingFace-format checkpoint names.

Registered with ``ModelRegistry.register_model("DeepseekV4ForCausalLM", ...)`` when the glue is
enabled. It is vLLM's own ``DeepseekV4ForCausalLM`` (whatever implementation vLLM picks for the
platform) with one change: its ``hf_to_vllm_mapper`` runs :mod:`model_glue.names`' HF -> native
rules first. Loading, layers and forward are vLLM's.
"""

from __future__ import annotations

from vllm.models.deepseek_v4 import DeepseekV4ForCausalLM as _VllmDeepseekV4ForCausalLM

from model_glue.names import with_hf_names

__all__ = ["DeepseekV4ForCausalLM"]


class DeepseekV4ForCausalLM(_VllmDeepseekV4ForCausalLM):
    # Class attribute: vLLM's loader maps the quantization config's layer lists with it.
    hf_to_vllm_mapper = with_hf_names(_VllmDeepseekV4ForCausalLM.hf_to_vllm_mapper)

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        # vLLM replaces the mapper per instance for FP8-expert checkpoints; extend that too.
        if "hf_to_vllm_mapper" in vars(self):
            self.hf_to_vllm_mapper = with_hf_names(vars(self)["hf_to_vllm_mapper"])
