"""``nvfp4::moe``: the routed experts of one DeepSeek-V4 MoE layer, NVFP4 weights.

``out[t] = output_scale * sum_j topk_weights[t, j] * expert(topk_ids[t, j])(hidden[t])``
with ``expert(e)(x) = down_e(silu(min(gate_e(x), L)) * clamp(up_e(x), -L, L))``.

CPU: the pure-torch reference (:func:`nvfp4_ops.reference.moe_reference`).
CUDA: the kernel :func:`nvfp4_ops.kernels.cuda_kernel` returns for ``"moe"``;
until one is registered the reference runs on the GPU, which syncs with the host per expert
and so must not be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from nvfp4_ops import kernels
from nvfp4_ops._library import qualname
from nvfp4_ops._validate import (
    NVFP4InputError,
    check_global_scale_values,
    check_moe_meta,
    check_topk_ids_values,
)
from nvfp4_ops.reference import moe_reference

__all__ = ["moe"]

_OP = "nvfp4.moe"


def _check(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
           w2_global, expert_start, global_num_experts) -> None:
    check_moe_meta(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
                   w2_global, expert_start)
    if global_num_experts > 0 and expert_start + w13.shape[0] > global_num_experts:
        raise NVFP4InputError(
            f"{_OP}: expert_start + E = {expert_start} + {w13.shape[0]} exceeds "
            f"global_num_experts = {global_num_experts}"
        )
    check_topk_ids_values(_OP, topk_ids, global_num_experts)
    check_global_scale_values(_OP, {"w13_global": w13_global, "w2_global": w2_global})


@torch.library.custom_op(qualname("moe"), mutates_args=())
def _moe_op(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_global: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_global: torch.Tensor,
    expert_start: int,
    global_num_experts: int,
    swiglu_limit: float | None,
    output_scale: float,
    wperm: bool = False,
) -> torch.Tensor:
    _check(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
           expert_start, global_num_experts)
    return moe_reference(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2,
                         w2_scale, w2_global, expert_start, swiglu_limit, output_scale,
                         wperm=wperm)


@_moe_op.register_kernel("cuda")
def _(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
      expert_start, global_num_experts, swiglu_limit, output_scale, wperm=False):
    _check(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
           expert_start, global_num_experts)
    impl = kernels.cuda_kernel("moe")
    if impl is None:
        return moe_reference(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2,
                             w2_scale, w2_global, expert_start, swiglu_limit, output_scale,
                             wperm=wperm)
    return impl(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
                w2_global, expert_start, swiglu_limit, output_scale, wperm=wperm)


@_moe_op.register_fake
def _(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
      expert_start, global_num_experts, swiglu_limit, output_scale, wperm=False):
    check_moe_meta(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
                   w2_global, expert_start)
    return hidden.new_empty(hidden.shape, dtype=torch.bfloat16)


def moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_global: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_global: torch.Tensor,
    *,
    expert_start: int = 0,
    global_num_experts: int = -1,
    swiglu_limit: float | None = None,
    output_scale: float = 1.0,
    wperm: bool = False,
) -> torch.Tensor:
    """NVFP4 routed experts of one MoE layer (``torch.ops.nvfp4.moe``).

    Args:
        hidden: ``bf16 [T, H]``, ``H % 32 == 0``; ``T`` may be 0.
        topk_ids: ``int32/int64 [T, k]``: **global** expert ids.
        topk_weights: ``float32 [T, k]`` router weights.
        w13: ``uint8 [E, 2I, H/2]`` (per expert: gate rows, then up rows); ``I % 32 == 0``.
        w13_scale: ``float8_e4m3fn [E, 2I, H/16]`` (or its bytes as ``uint8``).
        w13_global: ``float32 [E, 2]``: (gate, up) global scales, applied separately; or
            ``[E, 2I]``: one per row (what :func:`nvfp4_ops.mxfp4_to_nvfp4` produces).
        w2: ``uint8 [E, H, I/2]``; w2_scale: ``float8_e4m3fn [E, H, I/16]`` (or its bytes
            as ``uint8``);
            w2_global: ``float32 [E]``, or ``[E, H]``: one per row.
        expert_start: the first global id this rank owns; ids outside
            ``[expert_start, expert_start + E)`` contribute nothing here.
        global_num_experts: total experts over all ranks, for the id range check; -1 when
            unknown (then only ``id >= 0`` is checked).
        swiglu_limit: ``L`` of the clamped SwiGLU; None for none.
        output_scale: multiplier on the result (``routed_scaling_factor``; vLLM already folds
            it into ``topk_weights`` and passes 1.0).
        wperm: ``w13`` and ``w2`` hold their codes in the ``wperm`` bit order
            (:func:`nvfp4_ops.to_wperm_`, prepared once at load time), which the GPU kernels
            decode with fewer instructions; on CUDA this needs
            :func:`nvfp4_ops.kernels.dispatch.moe_wperm_supported` (V4-Flash and V4-Pro: yes).

    Returns:
        ``bf16 [T, H]``; a token with no local expert gets exactly 0.

    Raises:
        NVFP4InputError: wrong dtype, shape, device or alignment; ids outside
            ``[0, global_num_experts)``; non-finite or non-positive global scales. The id and
            scale checks read data, so they are skipped during CUDA-graph capture. ``wperm``
            weights on CUDA at sizes whose kernels cannot read them.
    """
    return torch.ops.nvfp4.moe(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2,
                               w2_scale, w2_global, expert_start, global_num_experts,
                               swiglu_limit, output_scale, wperm)
