"""CUDA implementation of ``nvfp4::moe``: routing -> gather -> GEMM 1 (+SwiGLU) -> GEMM 2
(+router weight) -> deterministic combine.

Data flow for ``T`` tokens, top-``k``, ``E`` local experts, ``N = T*k`` slots and the static
padded row count ``P`` (:func:`nvfp4_ops.kernels.triton.moe_routing.padded_rows`):

1. :func:`moe_routing` (Triton): slots grouped by local expert, each segment padded from its
   real count to a multiple of ``block_m``; ``tile_expert`` per ``block_m``-row tile (-1 past
   the end), ``tile_rows`` (real rows at the start of each tile: both GEMMs may compute the
   padding rows from any row of the tile, their outputs are never read) and ``slot_row``
   (slot -> row, -1 for non-local experts).
2. :func:`gather_rows` (Triton): ``a bf16 [P, H]`` = token rows in that order (zeros in padding
   rows), ``row_scale f32 [P]`` = router weight per row (0 in padding rows).
3. grouped W4A16 GEMM, ``swiglu`` epilogue: ``h bf16 [P, I]`` =
   ``silu(min(gate, L)) * clamp(up, -L, L)``; gate rows scaled by ``w13_global[e, 0]``, up rows
   by ``w13_global[e, 1]`` (separately, never folded). The GEMM reads ``w13_global [E, 2]``
   through the view ``[E, 2, I]`` (strides ``(s0, s1, 0)``;
   :func:`nvfp4_ops.kernels.linear_cuda.gate_up_global_view`).
4. grouped W4A16 GEMM, ``row_scale`` epilogue: ``y bf16 [P, H]`` =
   ``(h @ W2_e^T) * w2_global[e] * row_scale``; ``w2_global [E]`` through the view ``[E, 1, H]``
   (:func:`nvfp4_ops.kernels.linear_cuda.per_group_global_view`).
5. :func:`combine` (Triton): ``out[t] = bf16(output_scale * sum_j y[slot_row[t, j]])`` in fp32,
   fixed ``j`` order, non-local slots contribute 0.

When both GEMMs run a family that reads a permuted k order
(:func:`nvfp4_ops.kernels.linear_cuda.grouped_kperm`), ``a`` and ``h`` are stored in it
(:mod:`nvfp4_ops.kernels.kperm`): the gather writes ``a`` that way and GEMM 1's epilogue writes
``h`` that way. WGMMA tiles (16-256): every 32-block k-permuted, so the kernel decodes each
lane's own checkpoint bytes without gathering them (fewer instructions per weight). Streamed
8-token tiles (decode): every 8-block in pair order, so the activation loads are the MMA's B
fragment without byte permutes.

Launch overlap (``pdl``; the op always uses it): the gather, both GEMMs and the combine are
launched with programmatic dependent launch, so each can be resident, and the streamed GEMMs can
already stream weights, while the previous kernel finishes (V4-Flash T = 1 53.6 -> 49.2 us on
H200; ``w4a16_stream``, "Launch overlap"). Why it is ordered:

* every PDL-launched kernel waits (``griddepcontrol.wait``: the previous grid has completed and
  its writes are visible) before it reads another kernel's output or writes anything, and
  issues ``launch_dependents`` only after that wait. The gather and the combine wait in every
  CTA; a GEMM waits in every CTA that has a real tile, and in CTA 0 always.
* so when a kernel starts, its predecessor has passed its wait in every CTA that could let it
  launch, hence the kernel two back has completed: the GEMMs' producers may read
  ``tile_expert`` (written by the routing) before their own wait. Nothing else is read early,
  and the weights are never written.
* a kernel cannot complete before its predecessor (CTA 0 waits), so when the combine completes
  the whole chain has, and the next (plain-launched) kernel sees every buffer settled.

The routing kernel itself is launched plainly (after whatever produced ``topk_ids``) and lets
the gather launch at once. The WGMMA GEMMs (block_m >= 16) overlap the same way: their
producer streams the first stages' weight boxes before its wait, the activation tiles after it.

Every buffer is allocated with torch on the current device (the caching allocator, so the graph
pool under capture), every launch goes to the current stream, every grid comes from
``(T, k, E, H, I, block_m)``: no host synchronisation, so the whole op can be captured in a CUDA
graph and replayed with new hidden states *and* new routing. ``block_m`` is a static function
of ``(T*k, E)`` (:func:`choose_block_m`).

Numerics differ from :func:`nvfp4_ops.reference.moe_reference` only in fp32 summation order and
in rounding each slot's weighted expert output to bf16 before the fp32 combine (the reference
keeps it fp32; the contract allows either).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from nvfp4_ops._validate import NVFP4InputError
from nvfp4_ops.kernels.kperm import layout_block
from nvfp4_ops.kernels.linear_cuda import (
    BLOCK_MS,
    gate_up_global_view,
    grouped_kperm,
    grouped_layout,
    per_group_global_view,
    per_row_global_view,
)
from nvfp4_ops.kernels.triton.moe_combine import combine
from nvfp4_ops.kernels.triton.moe_routing import gather_rows, moe_routing, padded_rows

__all__ = ["BLOCK_MS", "choose_block_m", "covered_block_m", "moe_cuda", "moe_forward",
           "moe_supported", "op_tile", "padded_rows", "warmup_triton", "wperm_supported"]

def choose_block_m(num_slots: int, num_experts: int) -> int:
    """Token tile for ``num_slots = T*k`` slots over ``num_experts`` local experts: the
    smallest tile that holds the mean count of rows per expert (256 beyond that).

    Tiles of 8 run the decode kernel (a tile per used expert, weights streamed once); 16-256
    run the WGMMA kernel. Measured on H200 / V4-Flash (GEMM pair, benchmarks/results/
    wgmma_dev_h200.txt): T=512 (mean 12 rows): block_m 16 / 32 / 64 = 2026 / 2182 / 2732 us;
    T=4096 (mean 96): 64 / 128 = 5207 / 4150 us; T=16384 (mean 384): 128 / 256 = 14075 /
    12157 us. Pure function of static sizes.
    """
    mean = num_slots / max(1, num_experts)
    for block_m in BLOCK_MS:
        if mean <= block_m:
            return block_m
    return BLOCK_MS[-1]


@functools.cache
def covered_block_m(block_m: int, hidden_size: int, inter: int) -> int:
    """``block_m``, or the largest smaller tile both grouped GEMMs (gate/up: ``N_out = I``,
    ``K = H``; down: ``N_out = H``, ``K = I``) have a kernel for (the WGMMA kernel needs
    ``N_out % 64``; 8 always works here: mma.sync covers every size :func:`moe_supported`
    accepts)."""
    from nvfp4_ops.kernels.linear_cuda import grouped_supported

    while block_m > BLOCK_MS[0] and not (grouped_supported(inter, hidden_size, block_m)
                                         and grouped_supported(hidden_size, inter, block_m)):
        block_m = BLOCK_MS[BLOCK_MS.index(block_m) - 1]
    return block_m


def op_tile(num_tokens: int, top_k: int, num_experts: int, hidden_size: int,
            inter: int) -> tuple[int, bool]:
    """``(block_m, kperm)`` that :func:`moe_cuda` runs for these sizes (static): the tile of
    :func:`choose_block_m` that both GEMMs cover (:func:`covered_block_m`), and whether its
    family reads a permuted activation order
    (:func:`nvfp4_ops.kernels.linear_cuda.grouped_kperm`). Benchmarks and tests that drive
    :func:`moe_forward` directly take the op's choice from here."""
    block_m = covered_block_m(choose_block_m(num_tokens * top_k, num_experts), hidden_size,
                              inter)
    return block_m, grouped_kperm(hidden_size, inter, block_m)


def moe_supported(hidden_size: int, inter: int) -> bool:
    """Whether the grouped GEMM covers these sizes (both GEMMs: K and N_out multiples of 128
    and 16)."""
    return hidden_size % 128 == 0 and inter % 128 == 0


def moe_forward(
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
    *,
    gemm: Callable,
    block_m: int | None = None,
    kperm: bool = False,
    pdl: bool = False,
    wperm: bool = False,
) -> torch.Tensor:
    """The op's data flow (module docstring) with the grouped GEMM passed in as ``gemm``.

    ``gemm(a, tile_expert, w, w_scale, w_global, out, *, epilogue, swiglu_limit, row_scale,
    bias, block_m, tile_rows)`` follows the contract of ``grouped_w4a16_gemm`` (``tile_rows``:
    the routing's real rows per tile; the padding rows' outputs are never read, so the GEMM may
    compute them from any row of the tile); its ``w_global`` is the
    fp32 view ``[E, 2, I]`` of ``w13_global`` (GEMM 1) or ``[E, 1, H]`` of ``w2_global``
    (GEMM 2), with stride 0 along the rows. Arguments as for
    :func:`nvfp4_ops.moe` (already validated); ``block_m`` overrides :func:`choose_block_m`.
    ``kperm``: the gather and GEMM 1 write the activations in the permuted k order of the
    GEMM family that serves ``block_m`` (:func:`nvfp4_ops.kernels.linear_cuda.grouped_layout`:
    ``pair`` at 8, ``kperm`` at 16-256) and both GEMMs read them (``gemm`` then gets ``kperm=True``;
    :func:`nvfp4_ops.kernels.linear_cuda.grouped_kperm` says when both GEMMs have one).
    ``pdl``: launch overlap (module docstring, "Launch overlap"; ``gemm`` then gets
    ``pdl=True``; the Triton kernels take it on CUDA tensors only). ``wperm``: ``w13`` and
    ``w2`` hold their codes in the bit order of :mod:`nvfp4_ops.kernels.wperm` (``gemm`` then
    gets ``wperm=True``; needs ``kperm``).
    """
    num_tokens, hidden_size = hidden.shape
    top_k = topk_ids.shape[1]
    num_experts, two_inter = w13.shape[0], w13.shape[1]
    inter = two_inter // 2
    if num_tokens == 0:
        return torch.empty(0, hidden_size, dtype=torch.bfloat16, device=hidden.device)
    if block_m is None:
        block_m = choose_block_m(num_tokens * top_k, num_experts)
    routing = moe_routing(topk_ids, num_experts, expert_start, block_m, pdl=pdl)
    a, row_scale = gather_rows(hidden, topk_weights, routing, kperm, pdl=pdl)
    extra = {"kperm": True} if kperm else {}
    if pdl:
        extra["pdl"] = True
    if wperm:
        extra["wperm"] = True
    num_rows = a.shape[0]
    # views of the op's scales, no expansion kernel and no derived state to keep in sync
    # (the kernels take stride-0 fp32 views; gemm_interface)
    w13_rows = gate_up_global_view(w13_global, inter)
    w2_rows = (per_group_global_view(w2_global, hidden_size) if w2_global.dim() == 1
               else per_row_global_view(w2_global, hidden_size))
    act = torch.empty(num_rows, inter, dtype=torch.bfloat16, device=hidden.device)
    gemm(a, routing.tile_expert, w13, w13_scale, w13_rows, act, epilogue="swiglu",
         swiglu_limit=swiglu_limit, row_scale=None, bias=None, block_m=block_m,
         tile_rows=routing.tile_rows, **extra)
    expert_out = torch.empty(num_rows, hidden_size, dtype=torch.bfloat16, device=hidden.device)
    gemm(act, routing.tile_expert, w2, w2_scale, w2_rows, expert_out, epilogue="row_scale",
         swiglu_limit=None, row_scale=row_scale, bias=None, block_m=block_m,
         tile_rows=routing.tile_rows, **extra)
    return combine(expert_out, routing.slot_row, num_tokens, top_k, output_scale, pdl=pdl)


@functools.cache
def wperm_supported(hidden_size: int, inter: int) -> bool:
    """Whether the MoE's GPU kernels read ``w13`` / ``w2`` in the ``wperm`` bit order
    (:mod:`nvfp4_ops.kernels.wperm`) at every token tile the op can choose: both grouped GEMMs
    run a family with a permuted activation order (the streamed 8-token tiles, the WGMMA
    ``kperm`` tiles), which decode with ``pair4`` / its ``wperm`` twin. Static: sizes only."""
    if not moe_supported(hidden_size, inter):
        return False
    return all(grouped_kperm(hidden_size, inter, covered_block_m(bm, hidden_size, inter))
               for bm in BLOCK_MS)


def moe_cuda(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
             w2_global, expert_start, swiglu_limit, output_scale, wperm=False):
    """``CUDA_KERNELS["moe"]``: the validated op arguments -> ``bf16 [T, H]``.

    Sizes the grouped GEMM does not cover (H or I not a multiple of 128) run the reference.
    ``wperm`` weights need :func:`wperm_supported` (the op checks it first).
    """
    if not moe_supported(hidden.shape[1], w13.shape[1] // 2):
        from nvfp4_ops.reference import moe_reference

        return moe_reference(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2,
                             w2_scale, w2_global, expert_start, swiglu_limit, output_scale,
                             wperm=wperm)
    from nvfp4_ops.kernels.linear_cuda import grouped_w4a16_gemm

    hidden_size, inter = hidden.shape[1], w13.shape[1] // 2
    block_m, kperm = op_tile(hidden.shape[0], topk_ids.shape[1], w13.shape[0], hidden_size,
                             inter)
    if wperm and not wperm_supported(hidden_size, inter):
        raise NVFP4InputError(f"nvfp4.moe: wperm weights at H={hidden_size}, I={inter} need "
                              "kernels that read that order at every token tile, and these "
                              "sizes have none (moe_cuda.wperm_supported); pass checkpoint-"
                              "order weights")
    return moe_forward(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2,
                       w2_scale, w2_global, expert_start, swiglu_limit, output_scale,
                       gemm=grouped_w4a16_gemm, block_m=block_m, kperm=kperm, pdl=True,
                       wperm=wperm)


def warmup_triton(hidden_size: int, top_k: int, device: torch.device | str = "cuda",
                  id_dtypes: tuple[torch.dtype, ...] = (torch.int32, torch.int64)) -> list[str]:
    """Compile and run once every Triton variant the MoE path can reach for ``(H, k)``.

    The Triton kernels specialise only on ``block_m``, ``k``, ``H`` and the id dtype (never on
    ``T`` or ``E``), so tiny dummy inputs cover every batch size and EP split. The grouped-GEMM
    variants are warmed by :func:`nvfp4_ops._compile.warmup`. Call both before CUDA-graph
    capture.

    Returns:
        One name per variant warmed.
    """
    names = []
    num_tokens, num_experts = 3, 4
    hidden = torch.zeros(num_tokens, hidden_size, dtype=torch.bfloat16, device=device)
    weights = torch.full((num_tokens, top_k), 0.5, dtype=torch.float32, device=device)
    for id_dtype in id_dtypes:
        ids = (torch.arange(num_tokens * top_k, device=device) % (num_experts + 1)).to(id_dtype)
        ids = ids.reshape(num_tokens, top_k)
        for block_m in BLOCK_MS:
            # plain and PDL launches (the op uses PDL; tests and tools may call either)
            for pdl in (False, True):
                routing = moe_routing(ids, num_experts, 0, block_m, pdl=pdl)
                # natural, and the permuted order of this tile's family (what kperm=True writes)
                perm_ok = hidden_size % layout_block(grouped_layout(block_m)) == 0
                for kperm in (False, True) if perm_ok else (False,):
                    a, _ = gather_rows(hidden, weights, routing, kperm, pdl=pdl)
                combine(a, routing.slot_row, num_tokens, top_k, 1.0, pdl=pdl)
            names.append(f"moe_triton_h{hidden_size}_k{top_k}_bm{block_m}_{id_dtype}")
    return names
