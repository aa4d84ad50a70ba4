"""Reference for ``nvfp4::linear``: ``y = x @ dequant(W)^T`` with an exact fp32 order."""

from __future__ import annotations

import torch

from nvfp4_ops.format import decode


def linear_fp32(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    global_scale: torch.Tensor,
) -> torch.Tensor:
    """The fp32 result of an NVFP4 linear before bias and output rounding.

    Args:
        x: ``[M, K]`` bf16 (any float dtype; it is widened to fp32 exactly).
        weight: ``uint8 [N, K/2]``.
        weight_scale: ``float8_e4m3fn [N, K/16]``.
        global_scale: ``float32 []`` or ``[N]``.

    Returns:
        ``float32 [M, N]`` = ``(x @ decode(W)^T) * global_scale``.
    """
    w = decode(weight, weight_scale)  # [N, K], exact
    acc = x.float() @ w.T
    return acc * global_scale.float()


def linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    wfrag: bool = False,
) -> torch.Tensor:
    """``bf16 [M, N]`` = ``bf16(linear_fp32(...) + bias)``; shapes as in :func:`linear_fp32`,
    ``bias`` ``bf16 [N]`` or None; ``wfrag``: ``weight`` is in the prepared order of
    :func:`nvfp4_ops.orders.wfrag.prepare_` (undone here, exactly)."""
    if wfrag:
        from nvfp4_ops.orders.wfrag import unprepared

        weight = unprepared(weight)
    y = linear_fp32(x, weight, weight_scale, global_scale)
    if bias is not None:
        y = y + bias.float()
    return y.to(torch.bfloat16)
