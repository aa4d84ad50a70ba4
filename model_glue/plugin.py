"""The vLLM plugin: entry point ``vllm.general_plugins: nvfp4_ops = model_glue.plugin:register``.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers).
It always imports :mod:`nvfp4_ops`, which registers ``torch.ops.nvfp4.*`` (needed wherever a
graph that calls them is compiled or loaded). The glue itself is installed only when enabled
with the environment variable ``NVFP4_OPS_VLLM=1`` (inherited by every vLLM process); without
it vLLM runs exactly as stock. An environment switch rather than ``--additional-config``
because plugins run before vLLM has built its config, and quantization configs are chosen
while it builds it.

Installing means, through vLLM's public extension points only:

* ``register_quantization_config("deepseek_v4_fp8")`` and ``("modelopt_fp4")`` with
  subclasses of vLLM's own configs (:mod:`model_glue.configs`);
* ``ModelRegistry.register_model("DeepseekV4ForCausalLM", ...)`` with vLLM's model plus the
  HF-name mapping (:mod:`model_glue.models`), registered lazily by name.

It is idempotent, initialises no CUDA, and logs one line saying what it took over (including
whether MXFP4 routed experts are taken: ``NVFP4_OPS_MXFP4``, default on, see
:mod:`model_glue.configs`).
"""

from __future__ import annotations

import os

__all__ = ["ENV_SWITCH", "enabled", "register"]

ENV_SWITCH = "NVFP4_OPS_VLLM"
_TRUE = ("1", "true", "yes", "on")

_installed: list[str] | None = None


def enabled() -> bool:
    """Whether ``NVFP4_OPS_VLLM`` asks for the glue."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() in _TRUE


def register() -> list[str]:
    """vLLM plugin hook. Returns what was taken over (empty when disabled)."""
    global _installed
    import nvfp4_ops  # noqa: F401  (registers torch.ops.nvfp4.*; imports no kernels, no CUDA)

    if _installed is not None:
        return _installed
    if not enabled():
        return []
    _installed = _install()
    from vllm.logger import init_logger

    # Under the "vllm" logger so vLLM's handler and VLLM_LOGGING_LEVEL apply to it.
    init_logger("vllm.plugins.nvfp4_ops").info(
        "nvfp4_ops glue enabled (%s=1): %s", ENV_SWITCH, "; ".join(_installed))
    return _installed


def _install() -> list[str]:
    from vllm import ModelRegistry
    from vllm.model_executor.layers.quantization import (
        get_quantization_config,
        register_quantization_config,
    )

    from model_glue.configs import Nvfp4OpsModelOptConfig, make_deepseek_v4_fp8_config

    # Subclass whichever DeepseekV4FP8Config vLLM resolves on this platform (V4 or V4.1).
    vllm_dsv4_config = get_quantization_config("deepseek_v4_fp8")
    register_quantization_config("deepseek_v4_fp8")(make_deepseek_v4_fp8_config(vllm_dsv4_config))
    register_quantization_config("modelopt_fp4")(Nvfp4OpsModelOptConfig)
    ModelRegistry.register_model("DeepseekV4ForCausalLM",
                                 "model_glue.models:DeepseekV4ForCausalLM")
    from model_glue.configs import MXFP4_SWITCH, mxfp4_enabled

    mxfp4 = (f"MXFP4 ones (expert_dtype fp4 without an NVFP4 moe_quant_algo: DeepSeek's own "
             f"releases) -> exact NVFP4 scales + nvfp4::moe ({MXFP4_SWITCH}=0 keeps vLLM's)"
             if mxfp4_enabled() else f"MXFP4 ones stay vLLM's ({MXFP4_SWITCH}=0)")
    return [
        "deepseek_v4_fp8 routed experts: NVFP4 ones (moe_quant_algo NVFP4) -> nvfp4::moe; "
        + mxfp4,
        "modelopt_fp4 (NVFP4 / W4A16_NVFP4) DeepSeek-V4 routed experts -> nvfp4::moe, "
        "linear layers -> nvfp4::linear",
        "DeepseekV4ForCausalLM also loads HF-format (ModelOpt HF export) weight names",
    ]
