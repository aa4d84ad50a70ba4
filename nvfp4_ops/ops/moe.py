"""``nvfp4::moe``: the routed experts of one DeepSeek-V4 MoE layer, NVFP4 weights.

``out[t] = output_scale * sum_j topk_weights[t, j] * expert(topk_ids[t, j])(hidden[t])``
with ``expert(e)(x) = down_e(silu(min(gate_e(x), L)) * clamp(up_e(x), -L, L))``.

CPU: the pure-torch reference (:func:`nvfp4_ops.reference.moe_reference`).
CUDA: the kernel :func:`nvfp4_ops.kernels.cuda_kernel` returns for ``"moe"`` (Hopper only,
:mod:`nvfp4_ops._device`). Sizes the grouped GEMMs do not cover (``H`` or ``I`` not a multiple
of 128) run the reference on the GPU, which syncs with the host per expert and so must not be
captured in a CUDA graph.

Per call only metadata and the Python scalars are checked, on the host
(:mod:`nvfp4_ops._validate`): nothing reads device data, so an eager call does not sync.
The weights' values are checked once at load (:func:`nvfp4_ops.check_moe_weights`); ids
outside this rank's experts contribute nothing (the routing kernels drop them).
"""

from __future__ import annotations

import torch

from nvfp4_ops import _device, kernels
from nvfp4_ops._library import qualname
from nvfp4_ops._validate import (
    check_moe_meta,
    check_moe_scalars,
    check_topk_ids_values,
    check_weight_values,
    value_checks_enabled,
)
from nvfp4_ops.ops import _eager
from nvfp4_ops.reference import moe_reference

__all__ = ["moe"]

_OP = "nvfp4.moe"


def _check_meta(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
                w2_global, expert_start, global_num_experts, swiglu_limit, output_scale) -> None:
    """Host-only checks (metadata, Python scalars): every call, op and fake."""
    check_moe_meta(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
                   w2_global)
    check_moe_scalars(_OP, w13.shape[0], expert_start, global_num_experts, swiglu_limit,
                      output_scale)


def _check(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
           w2_global, expert_start, global_num_experts, swiglu_limit, output_scale) -> None:
    _check_meta(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
                w2_global, expert_start, global_num_experts, swiglu_limit, output_scale)
    if value_checks_enabled(hidden):  # opt-in debugging: reads device data (host syncs)
        check_topk_ids_values(_OP, topk_ids, global_num_experts)
        check_weight_values(_OP, {"w13_scale": w13_scale, "w2_scale": w2_scale},
                            {"w13_global": w13_global, "w2_global": w2_global})


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
           expert_start, global_num_experts, swiglu_limit, output_scale)
    return moe_reference(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2,
                         w2_scale, w2_global, expert_start, swiglu_limit, output_scale,
                         wperm=wperm)


#: launches of calls that repeat a checked one (same weights, same metadata; _eager.Repeats)
_repeats = _eager.Repeats()


@_moe_op.register_kernel("cuda")
def _moe_cuda(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
              w2_global, expert_start, global_num_experts, swiglu_limit, output_scale,
              wperm=False):
    inputs = (hidden, topk_ids, topk_weights)
    weights = (w13, w13_scale, w13_global, w2, w2_scale, w2_global)
    scalars = (expert_start, global_num_experts, swiglu_limit, output_scale, wperm)
    launch = _repeats.find(inputs, weights, scalars)
    if launch is not None:  # repeats a call that passed every check below
        return launch(hidden, topk_ids, topk_weights, expert_start, swiglu_limit, output_scale)
    _check(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
           expert_start, global_num_experts, swiglu_limit, output_scale)
    _device.require_supported_gpu(hidden.device)
    prepare = kernels.cuda_kernel("moe")
    launch = None if prepare is None else prepare(
        hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
        expert_start, swiglu_limit, output_scale, wperm=wperm,
        global_num_experts=global_num_experts)
    if launch is None:  # the reference is forced, or the grouped GEMMs do not cover (H, I)
        return moe_reference(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2,
                             w2_scale, w2_global, expert_start, swiglu_limit, output_scale,
                             wperm=wperm)
    _repeats.keep(inputs, weights, scalars, launch)
    return launch(hidden, topk_ids, topk_weights, expert_start, swiglu_limit, output_scale)


@_moe_op.register_fake
def _(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
      expert_start, global_num_experts, swiglu_limit, output_scale, wperm=False):
    _check_meta(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
                w2_global, expert_start, global_num_experts, swiglu_limit, output_scale)
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

    Only metadata and the Python scalars are checked per call; no device data is read, so
    an eager call never syncs. Check the weights' values (block scales without NaN or
    negative entries, global scales finite and > 0) once with
    :func:`nvfp4_ops.check_moe_weights` when they are loaded. ``NVFP4_OPS_VALUE_CHECKS=1``
    (debugging) also reads the ids and the scales on every eager call (host syncs; skipped
    during CUDA-graph capture).

    Args:
        hidden: ``bf16 [T, H]``, ``H % 32 == 0``; ``T`` may be 0.
        topk_ids: ``int32/int64 [T, k]``: **global** expert ids. Ids outside
            ``[expert_start, expert_start + E)`` (other ranks' experts, or invalid ones)
            contribute nothing here.
        topk_weights: ``float32 [T, k]`` router weights.
        w13: ``uint8 [E, 2I, H/2]`` (per expert: gate rows, then up rows); ``I % 32 == 0``.
        w13_scale: ``float8_e4m3fn [E, 2I, H/16]`` (or its bytes as ``uint8``).
        w13_global: ``float32 [E, 2]``: (gate, up) global scales, applied separately; or
            ``[E, 2I]``: one per row (what :func:`nvfp4_ops.mxfp4_to_nvfp4` produces).
        w2: ``uint8 [E, H, I/2]``; w2_scale: ``float8_e4m3fn [E, H, I/16]`` (or its bytes
            as ``uint8``);
            w2_global: ``float32 [E]``, or ``[E, H]``: one per row.
            **MXFP4** (DeepSeek's own checkpoints): ``w13_scale`` / ``w2_scale`` as
            ``float8_e8m0fnu [E, 2I, H/32]`` / ``[E, H, I/32]``, one UE8M0 scale per 32 k
            in the kernels' form (bytes in ``[9, 135]``, with per-row or per-expert-half global
            scales: :func:`nvfp4_ops.prepare_mxfp4_moe`), read by the GPU kernels as they are
            (:func:`nvfp4_ops.prepare.moe_mx_supported`; V4-Flash and V4-Pro:
            yes). The codes are the same.
        expert_start: the first global id this rank owns, ``>= 0``.
        global_num_experts: total experts over all ranks, ``>= expert_start + E``; -1 when
            unknown. The debug id check (``NVFP4_OPS_VALUE_CHECKS=1``) refuses ids outside
            ``[0, global_num_experts)`` (only ``id >= 0`` when unknown). On CUDA it also
            sizes the token tile for this rank's expected share of the slots (unknown: all
            local, a larger tile under expert parallelism); the result is the same up to
            fp32 summation order either way.
        swiglu_limit: ``L`` of the clamped SwiGLU, ``> 0``; None (or ``inf``, the same
            result) for no clamp.
        output_scale: multiplier on the result, finite (``routed_scaling_factor``; vLLM
            already folds it into ``topk_weights`` and passes 1.0).
        wperm: ``w13`` and ``w2`` hold their codes in the ``wperm`` bit order
            (:func:`nvfp4_ops.to_wperm_`, prepared once at load time), which the GPU kernels
            decode with fewer instructions; on CUDA this needs
            :func:`nvfp4_ops.prepare.moe_wperm_supported` (V4-Flash and V4-Pro: yes).

    Returns:
        ``bf16 [T, H]``; a token with no local expert gets exactly 0.

    Raises:
        NVFP4InputError: wrong dtype, shape, device or alignment; ``expert_start < 0``;
            ``global_num_experts`` 0, below -1 or below ``expert_start + E``; ``swiglu_limit``
            NaN, 0 or negative; ``output_scale`` NaN or infinite; ``wperm`` weights on CUDA
            at sizes whose kernels cannot read them. With ``NVFP4_OPS_VALUE_CHECKS=1`` also
            ids outside ``[0, global_num_experts)`` and bad scale values.
        NVFP4UnsupportedGPUError: CUDA tensors on a GPU other than Hopper (see
            :mod:`nvfp4_ops._device`).
    """
    args = (hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale, w2_global)
    if _eager.direct(*args):  # a plain eager CUDA call: skip the dispatcher's Python layers
        return _moe_cuda(*args, expert_start, global_num_experts, swiglu_limit, output_scale,
                         wperm)
    return torch.ops.nvfp4.moe(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2,
                               w2_scale, w2_global, expert_start, global_num_experts,
                               swiglu_limit, output_scale, wperm)
