"""Reference for ``nvfp4::mlp``: DeepSeek-V4's gated MLP (shared expert) in NVFP4."""

from __future__ import annotations

import torch

from nvfp4_ops.reference.linear import linear_fp32


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> torch.Tensor:
    """``silu(min(gate, L)) * clamp(up, -L, L)`` in fp32; no clamp when ``limit`` is None.

    The gate is clamped *before* SiLU, and only from above (DeepSeek-V4, vLLM's
    ``SiluAndMulWithClamp``).
    """
    gate = gate.float()
    up = up.float()
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    return torch.nn.functional.silu(gate) * up


def gate_up_activation(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_global: torch.Tensor,
    swiglu_limit: float | None,
) -> torch.Tensor:
    """The bf16 activation ``h [M, I]`` that feeds the down projection.

    ``w13`` is ``uint8 [2I, H/2]`` (gate rows, then up rows), ``w13_scale`` e4m3
    ``[2I, H/16]``, ``w13_global`` fp32 ``[2]`` = (gate, up), each half keeping its own scale,
    or ``[2I]``, one scale per row (what an exact MXFP4 conversion produces).
    """
    inter = w13.shape[0] // 2
    row_global = w13_global.float()
    if row_global.shape[-1] == 2:
        row_global = row_global.repeat_interleave(inter)  # [2I]
    gate_up = linear_fp32(x, w13, w13_scale, row_global)
    return clamped_swiglu(gate_up[:, :inter], gate_up[:, inter:], swiglu_limit).to(
        torch.bfloat16
    )


def mlp_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_global: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_global: torch.Tensor,
    swiglu_limit: float | None,
    wfrag: bool = False,
) -> torch.Tensor:
    """``bf16 [M, H]`` = down(clamped_swiglu(gate(x), up(x))).

    Args:
        x: ``bf16 [M, H]``.
        w13 / w13_scale / w13_global: gate+up, see :func:`gate_up_activation`.
        w2: ``uint8 [H, I/2]``; w2_scale: e4m3 ``[H, I/16]``; w2_global: fp32 ``[]`` or
            ``[H]`` (per row).
        swiglu_limit: ``L`` or None.
        wfrag: ``w13`` / ``w2`` are in the prepared order of
            :func:`nvfp4_ops.orders.wfrag.prepare_` (undone here, exactly).
    """
    if wfrag:
        from nvfp4_ops.orders.wfrag import unprepared

        w13, w2 = unprepared(w13), unprepared(w2)
    h = gate_up_activation(x, w13, w13_scale, w13_global, swiglu_limit)
    return linear_fp32(h, w2, w2_scale, w2_global).to(torch.bfloat16)
