"""Deterministic MoE combine (Triton): ``out[t] = output_scale * sum_j y[slot_row[t*k + j]]``.

``y bf16 [P, H]`` is the down-projection output in the padded row order with the router
weight already applied by the GEMM-2 epilogue; ``slot_row int32 [T*k]`` (from
:func:`nvfp4_ops.kernels.triton.moe_routing.moe_routing`) maps each slot to its row, -1 for
slots routed to experts of another EP rank, which contribute 0 (a token with no local expert
gets exactly 0). One program owns one token and one column block and adds the ``k`` rows in
fixed ``j`` order in fp32, then scales and rounds to bf16 once: no atomics, so the result is
bitwise reproducible.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nvfp4_ops.kernels.triton import _pdl
from nvfp4_ops.kernels.triton._launch import Launch, Launcher

__all__ = ["combine", "combine_launch"]


@triton.jit
def _combine_kernel(y_ptr, slot_row_ptr, out_ptr, output_scale,
                    HIDDEN: tl.constexpr, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr,
                    PDL: tl.constexpr):
    if PDL:
        _pdl.gdc_wait()
        _pdl.gdc_launch_dependents()
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < HIDDEN
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        row = tl.load(slot_row_ptr + token * TOP_K + j)
        safe_row = tl.where(row >= 0, row, 0).to(tl.int64)
        vals = tl.load(y_ptr + safe_row * HIDDEN + cols, mask=col_ok & (row >= 0), other=0.0)
        acc += vals.to(tl.float32)
    acc = acc * output_scale
    tl.store(out_ptr + token.to(tl.int64) * HIDDEN + cols, acc.to(tl.bfloat16), mask=col_ok)


_combine = Launcher(_combine_kernel)


def combine_launch(y: torch.Tensor, slot_row: torch.Tensor, out: torch.Tensor,
                   num_tokens: int, top_k: int, output_scale: float,
                   pdl: bool = False) -> Launch:
    """:func:`combine` into ``out bf16 [T, H]`` (``T >= 1``) as a launch not yet made (the
    kernel takes ``out`` as ``out_ptr``)."""
    hidden_size = y.shape[1]
    block_h = min(1024, triton.next_power_of_2(hidden_size))
    pdl = bool(pdl and y.is_cuda)
    return Launch(_combine, (num_tokens, triton.cdiv(hidden_size, block_h), 1),
                  (y, slot_row, out, float(output_scale), hidden_size, top_k, block_h, pdl),
                  _pdl.launch_kwargs(pdl))


def combine(y: torch.Tensor, slot_row: torch.Tensor, num_tokens: int, top_k: int,
            output_scale: float, pdl: bool = False) -> torch.Tensor:
    """Sum each token's ``k`` expert rows (see module docstring).

    Args:
        y: ``bf16 [P, H]`` contiguous (rows not referenced by ``slot_row`` are never read).
        slot_row: ``int32 [T * k]``, row of each slot or -1.
        num_tokens: ``T``; top_k: ``k``.
        output_scale: multiplier applied to the fp32 sum before the bf16 rounding.
        pdl: launch with programmatic dependent launch (:mod:`._pdl`; CUDA only).

    Returns:
        ``bf16 [T, H]``.
    """
    out = torch.empty(num_tokens, y.shape[1], dtype=torch.bfloat16, device=y.device)
    if num_tokens:
        combine_launch(y, slot_row, out, num_tokens, top_k, output_scale, pdl)()
    return out
