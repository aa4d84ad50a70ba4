"""Reference for ``nvfp4::moe``: the routed experts of one DeepSeek-V4 MoE layer."""

from __future__ import annotations

import torch

from nvfp4_ops.orders.wperm import from_wperm
from nvfp4_ops.reference.linear import linear_fp32
from nvfp4_ops.reference.mlp import gate_up_activation


def moe_reference(
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
    swiglu_limit: float | None,
    output_scale: float,
    wperm: bool = False,
) -> torch.Tensor:
    """``out[t] = output_scale * sum_j topk_weights[t, j] * expert(topk_ids[t, j])(hidden[t])``.

    Args:
        hidden: ``bf16 [T, H]``.
        topk_ids: ``int32/int64 [T, k]``, *global* expert ids. Ids outside
            ``[expert_start, expert_start + E)`` belong to another rank and contribute 0.
        topk_weights: ``float32 [T, k]``.
        w13: ``uint8 [E, 2I, H/2]`` (gate rows then up rows); w13_scale e4m3 ``[E, 2I, H/16]``;
            w13_global fp32 ``[E, 2]`` (gate, up) or ``[E, 2I]`` (per row).
        w2: ``uint8 [E, H, I/2]``; w2_scale e4m3 ``[E, H, I/16]``; w2_global fp32 ``[E]`` or
            ``[E, H]`` (per row).
        expert_start: first global id owned here.
        swiglu_limit: ``L`` or None.
        output_scale: multiplier on the sum (routed_scaling_factor).
        wperm: ``w13`` / ``w2`` hold their codes in the bit order of
            :mod:`nvfp4_ops.orders.wperm` (undone here, exactly).

    Returns:
        ``bf16 [T, H]``. Each expert's output stays fp32; the k contributions are summed in
        slot order in fp32, scaled, and rounded to bf16 once.

    Runs one expert at a time over the tokens routed to it (a host sync per expert: this is
    a reference, not a kernel).
    """
    if wperm:
        w13, w2 = from_wperm(w13), from_wperm(w2)
    num_tokens, top_k = topk_ids.shape
    num_experts = w13.shape[0]
    acc = torch.zeros(num_tokens, top_k, hidden.shape[1], dtype=torch.float32,
                      device=hidden.device)
    local = topk_ids.long() - expert_start
    for e in torch.unique(local).tolist():
        if e < 0 or e >= num_experts:
            continue
        tok, slot = torch.nonzero(local == e, as_tuple=True)
        h = gate_up_activation(hidden[tok], w13[e], w13_scale[e], w13_global[e], swiglu_limit)
        y = linear_fp32(h, w2[e], w2_scale[e], w2_global[e])
        acc[tok, slot] = y * topk_weights[tok, slot].float().unsqueeze(-1)
    return (acc.sum(dim=1) * output_scale).to(torch.bfloat16)
