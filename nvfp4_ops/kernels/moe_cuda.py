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
   (:func:`nvfp4_ops.kernels.linear_cuda.per_group_global_view`). ``y`` is written over ``a``
   (the same memory: one ``[P, H]`` buffer per call, not two), which every GEMM 1 has finished
   reading by then (the ordering below).
5. :func:`combine` (Triton): ``out[t] = bf16(output_scale * sum_j y[slot_row[t, j]])`` in fp32,
   fixed ``j`` order, non-local slots contribute 0.

The plan (:func:`nvfp4_ops.kernels.dispatch.plan_moe`, asked once per call) fixes the token
tile, the padded row count and the activation order: when both GEMMs run a family that reads
a permuted k order, ``a`` and ``h`` are stored in it (:mod:`nvfp4_ops.orders.kperm`): the
gather writes ``a`` that way and GEMM 1's epilogue writes ``h`` that way. WGMMA tiles
(16-256): every 32-block k-permuted, so the kernel decodes each lane's own checkpoint bytes
without gathering them (fewer instructions per weight). Streamed 8-token tiles (decode): every
8-block in pair order, so the activation loads are the MMA's B fragment without byte permutes.

Launch overlap (``MoEPlan.chained``; the op's plans always have it): the gather, both GEMMs and
the combine are launched with programmatic dependent launch, so each can be resident, and the
GEMMs can already stream weights, while the previous kernel finishes (``w4a16_stream``, "Launch
overlap"). Why it is ordered:

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
* hence GEMM 2 may write over GEMM 1's input ``a``: it writes only after its wait, when GEMM 1
  (with two tiles: both GEMM 1 launches, see below) has completed.

**Two token tiles** (``plan.hot``: hot experts in a larger tile, :mod:`~nvfp4_ops.kernels.
triton.moe_routing`, "Hot experts"): each GEMM runs once per tile, the hot one first and the
base one *beside* it (``WgmmaConfig.sibling``): the base GEMM does not wait, since what it
reads was complete when the hot GEMM let it launch (the hot GEMM's CTAs trigger only after
their own wait, CTA 0 always) and the rows it writes are not the hot GEMM's; its CTA 0 waits
at its end, so it still completes only after the hot GEMM, and the ordering argument above
holds for the chain gather -> hot 1 -> base 1 -> hot 2 -> base 2 -> combine. Why beside: a
few hot experts give the hot GEMM only a few CTAs, which after the base GEMM would leave
most SMs idle.

The routing kernel itself is launched plainly (after whatever produced ``topk_ids``) and lets
the gather launch at once. The WGMMA GEMMs (block_m >= 16) overlap the same way: their
producer streams the first stages' weight boxes before its wait, the activation tiles after it.

Every buffer is allocated with torch on the current device (:func:`moe_buffers`: the caching
allocator, so the graph pool under capture), every launch goes to the current stream, every
grid comes from ``(T, k, E, H, I)`` and the plan: no host synchronisation, so the whole op can
be captured in a CUDA graph and replayed with new hidden states *and* new routing. Eager calls
of a small size reuse their buffers (:func:`_call_buffers`) and the Triton launches bound to
them (:class:`_EagerLaunches`): a repeat pays the launch key of its new inputs only. Their
GEMMs, which read only those buffers and the weights, are replayed from a CUDA graph captured
after the first such call, and a call whose inputs and output sit at the addresses of an
earlier one replays the whole call from a graph (:class:`_EagerCall`,
:mod:`~nvfp4_ops.kernels.eager_graphs`): one graph launch instead of five to eight.

Numerics differ from :func:`nvfp4_ops.reference.moe_reference` only in fp32 summation order and
in rounding each slot's weighted expert output to bf16 before the fp32 combine (the reference
keeps it fp32; the contract allows either).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

import torch

from nvfp4_ops._validate import NVFP4InputError
from nvfp4_ops.kernels import dispatch, eager_graphs
from nvfp4_ops.kernels.dispatch import MoEPlan, WeightOrder
from nvfp4_ops.kernels.linear_cuda import gated_kernel_weights, memo_views, run_gemm
from nvfp4_ops.kernels.triton._launch import BoundLaunch
from nvfp4_ops.kernels.triton.moe_combine import combine, combine_launch
from nvfp4_ops.kernels.triton.moe_routing import (
    FUSED_MAX_SLOTS,
    MoERouting,
    gather_launch,
    gather_rows,
    moe_routing,
    routing_buffers,
    routing_launch,
    takes_direct_routing,
)
from nvfp4_ops.orders.kperm import KPERM

__all__ = ["MoEBuffers", "moe_buffers", "moe_cuda", "moe_forward", "moe_launch", "warmup_triton"]


class MoEBuffers(NamedTuple):
    """The intermediate buffers of one MoE call (uninitialised; every call writes what it
    reads): the routing's int32 buffers (:func:`~nvfp4_ops.kernels.triton.moe_routing.
    routing_buffers`), the gathered rows ``a bf16 [P, H]``, their router weights ``row_scale
    f32 [P]`` and GEMM 1's output ``act bf16 [P, I]``. GEMM 2 writes its output over ``a``
    (module docstring, "Launch overlap")."""

    routing: tuple[torch.Tensor, ...]
    a: torch.Tensor
    row_scale: torch.Tensor
    act: torch.Tensor


def moe_buffers(device: torch.device, plan: MoEPlan, num_slots: int, num_experts: int,
                hidden_size: int, inter: int) -> MoEBuffers:
    """Fresh :class:`MoEBuffers` for ``plan`` (``P = plan.num_rows`` rows), ``N = num_slots``
    slots, ``E`` local experts and sizes ``H``, ``I``."""
    rows, bf16 = plan.num_rows, torch.bfloat16
    hot = plan.hot.routing if plan.hot is not None else None
    return MoEBuffers(routing_buffers(device, num_slots, num_experts, plan.block_m, hot),
                      torch.empty(rows, hidden_size, dtype=bf16, device=device),
                      torch.empty(rows, dtype=torch.float32, device=device),
                      torch.empty(rows, inter, dtype=bf16, device=device))


#: Eager calls whose intermediates take at most this many bytes reuse them (per device,
#: stream and sizes; :func:`_call_buffers`), keeping at most ``_REUSE_TOTAL`` bytes in all.
_REUSE_MAX = 16 << 20
_REUSE_TOTAL = 64 << 20


class _EagerLaunches(NamedTuple):
    """The Triton launches of eager calls that reuse one set of buffers, bound to them
    (:class:`~nvfp4_ops.kernels.triton._launch.BoundLaunch`): ``route(topk_ids,
    expert_start)``, ``gather(hidden, topk_weights)``, ``combine(out, output_scale)``, and
    the routing they write."""

    routing: MoERouting
    route: BoundLaunch
    gather: BoundLaunch
    combine: BoundLaunch


class _Reused:
    """One set of reused buffers, its size in bytes, its bound launches (built by the first
    call that uses them) and what repeated calls over them keep (:class:`_EagerCall`, one per
    weights and scalars)."""

    __slots__ = ("bufs", "nbytes", "launches", "calls")

    def __init__(self, bufs: MoEBuffers, nbytes: int) -> None:
        self.bufs, self.nbytes = bufs, nbytes
        self.launches: _EagerLaunches | None = None
        self.calls: OrderedDict[tuple, _EagerCall] = OrderedDict()


class _EagerCall:
    """What repeated eager calls over one set of reused buffers keep for one set of weights
    and scalars (its key: :func:`_weights_key`, the SwiGLU limit, ``expert_start`` and
    ``output_scale``): the CUDA graph of the GEMMs over those buffers, captured after the
    first call loaded the binaries (:func:`~nvfp4_ops.kernels.eager_graphs.capture`), and the
    whole call's graphs keyed by its per-call tensors' addresses
    (:class:`~nvfp4_ops.kernels.eager_graphs.AddressGraphs`).

    Why it is exact: a graph holds the same launches with the same arguments, all of which
    are in the key or are the reused buffers (and, for a whole call, the per-call tensors at
    the addresses of its key); a replay reads whatever those addresses hold then (new
    routing, activations, weight values updated in place), and a weight whose storage moved
    gets a new key. The entry holds the plan, so the plan's ``id`` in the key cannot be reused
    by another plan while the entry exists; it holds no tensor (a graph keeps addresses), so
    it keeps no weights alive."""

    __slots__ = ("plan", "device", "gemm_graph", "captured", "whole")

    def __init__(self, plan: MoEPlan, device: torch.device) -> None:
        self.plan, self.device = plan, device
        self.gemm_graph: torch.cuda.CUDAGraph | None = None
        self.captured = False
        self.whole = eager_graphs.AddressGraphs(device, "nvfp4.moe")

    def gemms(self, make_launch: Callable[[], Callable[[], None]]) -> None:
        """The call's GEMMs: replayed from their graph where there is one (not inside a
        capture of the whole call, which takes the launches themselves), else launched and,
        after the first launch, captured for the next calls. ``make_launch()`` makes their
        launches (:func:`_gemm_launches`; made only when needed: a replay pays nothing for
        them, and nothing here keeps the weights' views)."""
        capturing = eager_graphs.caller_capturing()
        if self.gemm_graph is not None and eager_graphs.ENABLED and not capturing:
            self.gemm_graph.replay()
            return
        launch = make_launch()
        launch()
        if not self.captured and eager_graphs.ENABLED and not capturing:
            self.captured = True
            self.gemm_graph = eager_graphs.capture(launch, self.device, "nvfp4.moe")


#: :class:`_EagerCall` entries kept per set of reused buffers (one per layer and scalars: a
#: model's MoE layers each have their own weights), least recently used dropped first
_CALLS_MAX = 256


def _weights_key(plan: MoEPlan, views: tuple[torch.Tensor, ...]) -> tuple:
    """What the GEMMs over one set of reused buffers bake in besides them and the SwiGLU
    limit: the plan (its configs and sizes), the weights' addresses and the global scales'
    view strides (one per half or per row), all from their kernel-form ``views``. Codes and
    block scales are contiguous (the op checked them), so their address and the plan's sizes
    fix them. A kept launch computes it once (its plan and views are fixed:
    :func:`moe_launch`)."""
    w13, w13_scale, w13_rows, w2, w2_scale, w2_rows = views
    return (id(plan), w13.data_ptr(), w13_scale.data_ptr(), w2.data_ptr(), w2_scale.data_ptr(),
            w13_rows.data_ptr(), w13_rows.stride(), w2_rows.data_ptr(), w2_rows.stride())


_reused: OrderedDict[tuple, _Reused] = OrderedDict()


def _call_buffers(device: torch.device, plan: MoEPlan, top_k: int, num_slots: int,
                  num_experts: int, hidden_size: int, inter: int, pdl: bool
                  ) -> tuple[MoEBuffers, _Reused | None]:
    """The buffers of one call: reused between eager calls of the same sizes on one stream
    (with the :class:`_Reused` entry that holds them), fresh otherwise (entry None).

    Why it is safe: calls on one stream run one after the other (the routing kernel, the
    first of a call, is launched without launch overlap, so it starts after the previous
    call's last kernel has completed), nothing of the buffers escapes a call (the op returns
    a fresh output), and each call writes every element it reads. Not under CUDA-graph
    capture: a graph keeps its buffers (from the graph pool) for its replays, which may run
    while other work uses the stream's. Why: an eager decode call otherwise spends more host
    time on the allocator, views and launch arguments than its kernels run.
    """
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return moe_buffers(device, plan, num_slots, num_experts, hidden_size, inter), None
    nbytes = plan.num_rows * (2 * hidden_size + 2 * inter + 4)
    if nbytes > _REUSE_MAX:
        return moe_buffers(device, plan, num_slots, num_experts, hidden_size, inter), None
    index = device.index
    # the sizes the buffers and their launches depend on (not the plan itself: hashing it
    # costs microseconds)
    key = (index, torch._C._cuda_getCurrentRawStream(index), plan.num_rows, plan.block_m,
           num_slots, num_experts, hidden_size, inter, plan.hot is not None and plan.hot.routing,
           top_k, plan.act_order, pdl)
    hit = _reused.get(key)
    if hit is not None:
        _reused.move_to_end(key)
        return hit.bufs, hit
    entry = _reused[key] = _Reused(
        moe_buffers(device, plan, num_slots, num_experts, hidden_size, inter), nbytes)
    while sum(e.nbytes for e in _reused.values()) > _REUSE_TOTAL:
        _reused.popitem(last=False)
    return entry.bufs, entry


def _bind_launches(bufs: MoEBuffers, plan: MoEPlan, num_experts: int, hidden: torch.Tensor,
                   topk_ids: torch.Tensor, topk_weights: torch.Tensor, expert_start: int,
                   out: torch.Tensor, output_scale: float, pdl: bool) -> _EagerLaunches:
    """The Triton launches of a call into the reused ``bufs``, built from this call's
    arguments and bound so that later calls replace only those (:class:`_EagerLaunches`)."""
    hot = plan.hot.routing if plan.hot is not None else None
    routing, route = routing_launch(topk_ids, num_experts, expert_start,
                                    plan.block_m, pdl, bufs.routing, hot)
    _, gather = gather_launch(hidden, topk_weights, routing, plan.act_order, pdl,
                              (bufs.a, bufs.row_scale))
    num_tokens, top_k = topk_ids.shape
    combine = combine_launch(bufs.a, routing.slot_row, out, num_tokens, top_k,
                             output_scale, pdl)
    # the per-call values, in the order _EagerLaunches documents
    return _EagerLaunches(routing, route.bind("topk_ids_ptr", "expert_start"),
                          gather.bind("hidden_ptr", "topk_weights_ptr"),
                          combine.bind("out_ptr", "output_scale"))


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
    plan: MoEPlan,
    gemm: Callable = run_gemm,
) -> torch.Tensor:
    """The op's data flow (module docstring) for ``plan``, with the grouped GEMM passed in as
    ``gemm`` (arguments as :func:`nvfp4_ops.moe`, already validated; ``T >= 1``).

    ``gemm(gemm_plan, a, w, w_scale, w_global, out, *, tile_expert, tile_rows, row_scale,
    swiglu_limit, check)`` follows :func:`nvfp4_ops.kernels.linear_cuda.run_gemm`, called
    with ``check=False`` (arguments in the binaries' form: ``w`` / ``w_scale`` as
    ``kernel_weight`` returns them; ``tile_rows``: the routing's real rows per tile, the
    padding rows' outputs are never read, so the GEMM may compute them from any row of the
    tile); its ``w_global`` is the fp32 view ``[E, 2, I]`` of ``w13_global`` (GEMM 1) or
    ``[E, 1, H]`` of ``w2_global`` (GEMM 2); GEMM 2's ``out`` is GEMM 1's ``a``. Tests pass a
    torch stand-in to check the data flow without the CuTeDSL kernels. The Triton kernels are
    launched with launch overlap when ``plan.chained`` (CUDA tensors only; the GEMMs' launch
    mode is in their own configs, from the same plan).
    """
    # the weights as the binaries take them (uint8 scale bytes) and views of the op's global
    # scales: no expansion kernel, no derived state to keep in sync; reused between eager
    # calls with the same weight tensors (memo_views)
    weights = (w13, w13_scale, w13_global, w2, w2_scale, w2_global)
    views = memo_views("moe", weights, lambda: gated_kernel_weights(*weights))
    return _forward(hidden, topk_ids, topk_weights, views, expert_start, swiglu_limit,
                    output_scale, plan, gemm, None)


def _forward(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
             views: tuple, expert_start: int, swiglu_limit: float | None, output_scale: float,
             plan: MoEPlan, gemm: Callable, weights_key: tuple | None) -> torch.Tensor:
    """:func:`moe_forward` on the weights' kernel-form ``views`` (:func:`~nvfp4_ops.kernels.
    linear_cuda.gated_kernel_weights`); ``weights_key``: :func:`_weights_key` of ``plan`` and
    ``views`` where the caller keeps it (None: computed when needed)."""
    num_tokens, hidden_size = hidden.shape
    num_experts, inter = views[0].shape[0], views[0].shape[1] // 2
    top_k = topk_ids.shape[1]
    num_slots = num_tokens * top_k
    pdl = plan.chained
    bufs, reused = _call_buffers(hidden.device, plan, top_k, num_slots, num_experts,
                                 hidden_size, inter, pdl)
    hot = plan.hot
    if reused is None or gemm is not run_gemm:
        routing = moe_routing(topk_ids, num_experts, expert_start, plan.block_m, pdl=pdl,
                              buffers=bufs.routing, hot=hot.routing if hot is not None else None)
        gather_rows(hidden, topk_weights, routing, plan.act_order, pdl=pdl,
                    out=(bufs.a, bufs.row_scale))
        _gemm_launches(plan, bufs, routing, views, swiglu_limit, gemm)()
        return combine(bufs.a, routing.slot_row, num_tokens, top_k, output_scale, pdl=pdl)
    # a repeated eager call (_Reused, _EagerCall)
    if weights_key is None:
        weights_key = _weights_key(plan, views)
    key = (weights_key, swiglu_limit, expert_start, output_scale)
    call = reused.calls.get(key)
    if call is None:
        call = reused.calls[key] = _EagerCall(plan, hidden.device)
        while len(reused.calls) > _CALLS_MAX:
            reused.calls.popitem(last=False)
    else:
        reused.calls.move_to_end(key)
    if num_slots > FUSED_MAX_SLOTS:  # routing by the unfused kernels: GEMMs from their graph
        routing = moe_routing(topk_ids, num_experts, expert_start, plan.block_m, pdl=pdl,
                              buffers=bufs.routing, hot=hot.routing if hot is not None else None)
        gather_rows(hidden, topk_weights, routing, plan.act_order, pdl=pdl,
                    out=(bufs.a, bufs.row_scale))
        call.gemms(lambda: _gemm_launches(plan, bufs, routing, views, swiglu_limit, run_gemm))
        return combine(bufs.a, routing.slot_row, num_tokens, top_k, output_scale, pdl=pdl)
    launches = reused.launches
    out = torch.empty(num_tokens, hidden_size, dtype=torch.bfloat16, device=hidden.device)
    if launches is None:
        launches = reused.launches = _bind_launches(
            bufs, plan, num_experts, hidden, topk_ids, topk_weights, expert_start, out,
            output_scale, pdl)
    output_scale = float(output_scale)

    def gemms() -> Callable[[], None]:
        return _gemm_launches(plan, bufs, launches.routing, views, swiglu_limit, run_gemm)

    def launch() -> None:
        launches.route(topk_ids, expert_start)
        launches.gather(hidden, topk_weights)
        call.gemms(gemms)
        launches.combine(out, output_scale)

    # the ids' dtype picks the routing kernel's specialisation
    call.whole.run((hidden, topk_ids, topk_weights, out), launch, (topk_ids.dtype,))
    return out


def _gemm_launches(plan: MoEPlan, bufs: MoEBuffers, routing: MoERouting, views: tuple,
                   swiglu_limit: float | None, gemm: Callable) -> Callable[[], None]:
    """The call's grouped GEMMs over ``bufs`` as a function of no arguments: each GEMM once
    per token tile, over the rows its tiles cover, the hot tile first, then the base tile
    beside it (module docstring, "Two token tiles"). GEMM 2 writes over GEMM 1's input
    (module docstring). No second check: the op validated the arguments and every buffer here
    is built for the plan (contiguous; row slices start at a multiple of block_m rows, so
    stay 16-byte aligned). With one tile the base tiles cover the whole buffer: no views
    (each costs host time on an eager call)."""
    w13, w13_scale, w13_rows, w2, w2_scale, w2_rows = views
    a, act, row_scale = bufs.a, bufs.act, bufs.row_scale
    hot = plan.hot
    if hot is None:
        tiles = [(plan.gate_up, plan.down, None, routing.tile_expert, routing.tile_rows)]
    else:
        base_rows = slice(0, routing.tile_expert.shape[0] * plan.block_m)
        tiles = [(hot.gate_up, hot.down, slice(routing.hot_row0, None),
                  routing.hot_tile_expert, routing.hot_tile_rows),
                 (plan.gate_up, plan.down, base_rows, routing.tile_expert, routing.tile_rows)]

    def launch_gemms() -> None:
        for gate_up, _, rows, tile_expert, tile_rows in tiles:
            gemm(gate_up, _rows(a, rows), w13, w13_scale, w13_rows, _rows(act, rows),
                 tile_expert=tile_expert, tile_rows=tile_rows, row_scale=None,
                 swiglu_limit=swiglu_limit, check=False)
        for _, down, rows, tile_expert, tile_rows in tiles:
            gemm(down, _rows(act, rows), w2, w2_scale, w2_rows, _rows(a, rows),
                 tile_expert=tile_expert, tile_rows=tile_rows,
                 row_scale=_rows(row_scale, rows), swiglu_limit=None, check=False)

    return launch_gemms


def _rows(t: torch.Tensor, rows: slice | None) -> torch.Tensor:
    return t if rows is None else t[rows]


def moe_launch(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
               w2_global, expert_start, swiglu_limit, output_scale, wperm=False,
               global_num_experts=-1) -> Callable | None:
    """The CUDA launch of ``nvfp4::moe`` for these sizes (the op's arguments, already
    validated): a function ``(hidden, topk_ids, topk_weights, expert_start, swiglu_limit,
    output_scale) -> bf16 [T, H]`` for inputs of the same dtypes, shapes and strides, which
    holds the plan and the weights' kernel-form views (not the weight tensors: their storage
    only); None where the grouped GEMMs do not cover the sizes (H or I not a multiple of 128;
    the op then runs the reference). The op keeps it for repeated calls
    (:class:`nvfp4_ops.ops._eager.Repeats`).

    ``global_num_experts`` only sizes the token tile (:func:`nvfp4_ops.kernels.dispatch.
    plan_moe`); the ids were checked against it by the op. MXFP4 scales
    (``float8_e8m0fnu``, the op validated both) run the kernels' UE8M0 variants.

    Raises:
        NVFP4InputError: ``wperm`` weights at sizes whose kernels cannot read them at every
            token tile (:func:`nvfp4_ops.kernels.dispatch.moe_wperm_supported`), or MXFP4
            scales at sizes whose kernels cannot read those
            (:func:`nvfp4_ops.kernels.dispatch.moe_mx_supported`).
    """
    num_tokens, hidden_size = hidden.shape
    inter, device = w13.shape[1] // 2, hidden.device
    if num_tokens == 0:
        return lambda hidden, *_: torch.empty(0, hidden_size, dtype=torch.bfloat16,
                                              device=device)
    if wperm and dispatch.moe_supported(hidden_size, inter) and not (
            dispatch.moe_wperm_supported(hidden_size, inter)):
        raise NVFP4InputError(f"nvfp4.moe: wperm weights at H={hidden_size}, I={inter} need "
                              "kernels that read that order at every token tile, and these "
                              "sizes have none (dispatch.moe_wperm_supported); pass checkpoint-"
                              "order weights")
    mx = w13_scale.dtype == torch.float8_e8m0fnu
    if mx and dispatch.moe_supported(hidden_size, inter) and not (
            dispatch.moe_mx_supported(hidden_size, inter)):
        raise NVFP4InputError(f"nvfp4.moe: MXFP4 scales (float8_e8m0fnu) at H={hidden_size}, "
                              f"I={inter} need kernels that read them at every token tile, and "
                              "these sizes have none (dispatch.moe_mx_supported: H and I "
                              "multiples of 512); convert them with nvfp4_ops.mxfp4_to_nvfp4")
    plan = dispatch.plan_moe(num_tokens, topk_ids.shape[1], w13.shape[0], hidden_size, inter,
                             global_num_experts=global_num_experts,
                             order=WeightOrder.WPERM if wperm else WeightOrder.CHECKPOINT,
                             mx=mx)
    if plan is None:
        return None
    weights = (w13, w13_scale, w13_global, w2, w2_scale, w2_global)
    views = memo_views("moe", weights, lambda: gated_kernel_weights(*weights))
    weights_key = _weights_key(plan, views)

    def launch(hidden, topk_ids, topk_weights, expert_start, swiglu_limit, output_scale):
        return _forward(hidden, topk_ids, topk_weights, views, expert_start, swiglu_limit,
                        output_scale, plan, run_gemm, weights_key)

    return launch


def moe_cuda(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
             w2_global, expert_start, swiglu_limit, output_scale, wperm=False,
             global_num_experts=-1):
    """:func:`moe_launch` run once: ``bf16 [T, H]``, or None where the grouped GEMMs do not
    cover the sizes."""
    launch = moe_launch(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2,
                        w2_scale, w2_global, expert_start, swiglu_limit, output_scale, wperm,
                        global_num_experts)
    return None if launch is None else launch(hidden, topk_ids, topk_weights, expert_start,
                                              swiglu_limit, output_scale)


def warmup_triton(hidden_size: int, top_k: int, tiles: list[tuple[int, str]],
                  device: torch.device | str = "cuda",
                  id_dtypes: tuple[torch.dtype, ...] = (torch.int32, torch.int64)) -> list[str]:
    """Compile and run once every Triton variant the MoE path reaches for ``(H, k)`` at the
    ``(block_m, act_order)`` pairs ``tiles`` (:func:`nvfp4_ops.kernels.dispatch.moe_act_orders`).

    The Triton kernels specialise only on ``block_m`` (and its hot tile), ``k``, ``H``, the
    layout and the id dtype (never on ``T`` or ``E``), so tiny dummy inputs cover every batch
    size and EP split; the routing runs both as one CTA (decode) and as its four launches
    (large T), and as the direct kernel (one token) where ``DIRECT_ROUTING`` takes it. Both
    launch modes are warmed (the op uses launch overlap; tests and tools may
    launch plainly).

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
        for block_m, layout in tiles:
            hot_class = dispatch.moe_hot_class(block_m) if layout == KPERM else None
            for hot in (None, hot_class) if hot_class is not None else (None,):
                # the four-launch routing of large T (no launch overlap) too
                moe_routing(ids, num_experts, 0, block_m, hot=hot, fused=False)
                for pdl in (False, True):
                    routing = moe_routing(ids, num_experts, 0, block_m, pdl=pdl, hot=hot)
                    a, _ = gather_rows(hidden, weights, routing, layout, pdl=pdl)
                    combine(a, routing.slot_row, num_tokens, top_k, 1.0, pdl=pdl)
                    if takes_direct_routing(top_k, block_m, hot):
                        # one token's routing takes the direct kernel
                        moe_routing(ids[:1], num_experts, 0, block_m, pdl=pdl, hot=hot)
                names.append(f"moe_triton_h{hidden_size}_k{top_k}_bm{block_m}_{layout}"
                             f"{f'_hot{hot.block_m}' if hot else ''}_{id_dtype}")
    return names
