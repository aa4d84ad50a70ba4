"""CPU stand-ins for the few CUDA-only pieces vLLM 0.33 needs to build and run DeepSeek-V4's
``ffn`` layers on a machine without a GPU (REFERENCE section 8.6). Everything else the glue
tests touch is vLLM's own code.

Each stand-in replaces one CUDA kernel or CUDA runtime object, is written here from its
documented semantics (not copied from vLLM), and is installed only for the test session
through ``install(monkeypatch)``. They are pinned to vLLM 0.33.0: on any other version the
tests that need them skip, because the internals they replace may have moved.
"""

from __future__ import annotations

import torch

VLLM_VERSION = "0.33.0"
FP8_BLOCK = 128


class _CpuStream:
    """``torch.cuda.Stream`` stand-in: DeepSeek-V4's model creates auxiliary streams at build."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass


def _block_dequant(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 ``[N, K]`` weight times its 128x128 block scales -> fp32 ``[N, K]``."""
    if scale.dtype == torch.uint8:  # ue8m0 stored as raw exponent bytes
        scale = torch.exp2(scale.float() - 127.0)
    s = scale.float().repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)
    return weight.float() * s[: weight.shape[0], : weight.shape[1]]


def _make_fp8_block_kernel():
    from vllm.model_executor.kernels.linear.scaled_mm.BlockScaledMMLinearKernel import (
        Fp8BlockScaledMMLinearKernel,
    )

    class CpuDequantFp8BlockKernel(Fp8BlockScaledMMLinearKernel):
        """Block-FP8 linear as dequantize-then-matmul in fp32 (bf16 activations in)."""

        apply_input_quant = False

        @classmethod
        def is_supported(cls, compute_capability=None):
            return True, None

        def process_weights_after_loading(self, layer):
            pass

        def apply_block_scaled_mm(self, A, B, As, Bs):
            return A.float() @ _block_dequant(B, Bs).t()

    return CpuDequantFp8BlockKernel


def softplus_sqrt_topk(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    routed_scaling_factor: float,
    bias: torch.Tensor | None,
    input_tokens: torch.Tensor | None,
    hash_table: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4 routing: scores ``sqrt(softplus(logits))``; experts from the hash table
    (hash layers) or the top-k of ``scores + bias``; weights are the chosen scores,
    renormalised to sum 1, times ``routed_scaling_factor``."""
    scores = torch.sqrt(torch.nn.functional.softplus(logits.float()))
    if hash_table is not None and input_tokens is not None:
        ids = hash_table[input_tokens.long()].long()
    else:
        sel = scores if bias is None else scores + bias.float()
        ids = sel.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * routed_scaling_factor, ids


def _topk_softplus_sqrt_standin(topk_weights, topk_indices, token_expert_indices,
                                gating_output, renormalize=False,
                                e_score_correction_bias=None, input_tokens=None,
                                hash_indices_table=None, routed_scaling_factor=1.0,
                                bias_vl=None, image_sentinel_lo=0):
    w, ids = softplus_sqrt_topk(gating_output, topk_indices.shape[1], renormalize,
                                routed_scaling_factor, e_score_correction_bias, input_tokens,
                                hash_indices_table)
    topk_weights.copy_(w)
    topk_indices.copy_(ids.to(topk_indices.dtype))
    return topk_weights, topk_indices


def install(monkeypatch) -> None:
    """Install every stand-in (undone by ``monkeypatch`` at teardown)."""
    import vllm
    from vllm.model_executor.kernels import linear as linear_kernels
    from vllm.model_executor.layers.fused_moe.router import fused_topk_bias_router
    from vllm.platforms import PlatformEnum, current_platform
    from vllm.platforms.interface import DeviceCapability

    assert vllm.__version__ == VLLM_VERSION, vllm.__version__
    monkeypatch.setattr(current_platform, "device_type", "cpu")
    monkeypatch.setattr(current_platform, "get_device_capability",
                        lambda device_id=0: DeviceCapability(9, 0))
    monkeypatch.setattr(torch.cuda, "Stream", _CpuStream)
    kernels = dict(linear_kernels._POSSIBLE_FP8_BLOCK_KERNELS)
    kernels[PlatformEnum.UNSPECIFIED] = [_make_fp8_block_kernel()]
    monkeypatch.setattr(linear_kernels, "_POSSIBLE_FP8_BLOCK_KERNELS", kernels)
    monkeypatch.setattr(fused_topk_bias_router, "vllm_topk_softplus_sqrt",
                        _topk_softplus_sqrt_standin)
