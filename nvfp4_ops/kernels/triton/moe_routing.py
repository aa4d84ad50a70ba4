"""MoE routing preparation on the GPU: global ids -> padded, expert-grouped rows (Triton).

Given ``topk_ids [T, k]`` (global expert ids) the grouped GEMMs need the ``N = T*k`` slots
(slot ``s = t*k + j``) grouped by local expert, each expert's segment padded from its *real*
token count up to a multiple of ``block_m`` (nothing is ever dropped, there is no capacity):

* ``expert_offsets int32 [E+1]``: padded segment starts; expert ``e`` owns rows
  ``[expert_offsets[e], expert_offsets[e+1])``; every entry is a multiple of ``block_m``;
  an expert without tokens has an empty segment. (With hot experts, below: a hot expert's
  entry is the start of its segment in the hot region, and ``expert_offsets[E]`` ends the
  base region.)
* ``sorted_slots int32 [P]``: the slot held by each padded row, ``N`` (sentinel) for padding
  rows and for rows past the last segment.
* ``tile_expert int32 [P / block_m]``: local expert of each ``block_m``-row tile, -1 for the
  tiles past the last segment (the GEMMs skip them).
* ``tile_rows int32 [P / block_m]``: how many leading rows of each tile hold slots (1 to
  ``block_m`` in a tile of an expert, 0 past the last segment); the rest are padding.
* ``slot_row int32 [N]``: the inverse map, padded row of each slot, -1 for slots whose expert
  is not local (ids outside ``[expert_start, expert_start + E)``; another EP rank owns them).

``P`` is a static upper bound that depends only on ``(N, E, block_m)``: at most
``min(E, N)`` experts are non-empty and each wastes at most ``block_m - 1`` padding rows, so
``P = round_up(N + min(E, N) * (block_m - 1), block_m)`` (tighter than
``N + E * (block_m - 1)`` at decode: T = 1, k = 6, E = 256, block_m = 8 gives 48, not 1800).
Every grid size comes from ``N``, ``E``, ``P`` and ``H`` alone, so the launches can be
captured in a CUDA graph and replayed with new routing.

**Hot experts** (an optional second token tile, :class:`HotClass`). Under skewed routing a
few experts get far more rows than the rest, and one tile for all is wrong for both (small
tiles stream a hot expert's weights many times, large ones pad the cold experts). With a hot
class, each expert takes the tile that costs it less (``ceil(rows / tile) * cost``, from its
real count, on the device): base experts' segments are laid out upwards from row 0 as above,
hot experts' segments (padded to ``hot.block_m``) downwards from row ``P``, and the hot tiles
are described by their own ``hot_tile_expert`` / ``hot_tile_rows`` over the last rows that
can hold them (:func:`hot_region_rows`; -1 / 0 outside the hot segments). The base tiles keep
the one-tile bound (base segments never pass it). Each GEMM then runs twice, once per tile,
each over its own tiles. ``P`` grows by ``hot.block_m - block_m`` rows per expert that can be
hot (at most ``N / hot.min_rows``), so both regions always fit without overlapping.

Four launches (one fused single-CTA kernel when ``N <= FUSED_MAX_SLOTS``; at decode, with
``DIRECT_ROUTING``, the direct kernel, one pass without atomics or barriers: see
``DIRECT_MAX_SLOTS``), none reads a device value on the host:

1. ``counts`` (zeroed by the caller) += 1 per local slot (int32 atomics: the totals are
   exact and deterministic).
2. one program: padded sizes, exclusive scan -> ``expert_offsets``, per-expert write cursors,
   ``tile_expert``, ``tile_rows`` (each expert's lane writes its segment's tiles, as many steps
   as the largest segment has tiles); fills ``sorted_slots`` with the sentinel.
3. each local slot takes the next row of its expert's segment with an int32 atomic on the
   cursor. The order of slots *inside* a segment therefore depends on scheduling, but
   every GEMM row is computed from its own input row only, and the combine reads each slot's
   row through ``slot_row`` in fixed ``j`` order, so the op's output is bitwise
   deterministic.
4. gather: ``a[r] = hidden[sorted_slots[r] // k]`` (zeros for padding rows) and
   ``row_scale[r] = topk_weights.flat[sorted_slots[r]]`` (0 for padding rows), for the tiles
   that hold rows; tiles past the end are left untouched (the GEMMs skip them). In a
   permuted layout of :mod:`nvfp4_ops.orders.kperm` (``kperm``: every 32-block, for the WGMMA
   tiles; ``pair``: every 8-block, for the streamed 8-token tiles) the columns are written in
   that order by a register transpose: loads and stores stay contiguous (permuting through
   strided loads instead was several times slower).

The jitted functions never specialise on the token or expert counts (``do_not_specialize``),
so one compiled variant per ``(block_m, k, H, id dtype)`` serves every T and every EP split.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from nvfp4_ops.kernels.triton import _pdl
from nvfp4_ops.kernels.triton._launch import Launch, Launcher
from nvfp4_ops.orders.kperm import NATURAL, layout_block

__all__ = [
    "DIRECT_MAX_SLOTS",
    "DIRECT_ROUTING",
    "FUSED_MAX_SLOTS",
    "FUSED_NUM_WARPS",
    "MAX_EXPERTS",
    "HotClass",
    "MoERouting",
    "gather_launch",
    "gather_rows",
    "hot_experts_bound",
    "hot_region_rows",
    "moe_routing",
    "padded_rows",
    "direct_routing_fits",
    "routing_buffers",
    "routing_launch",
    "takes_direct_routing",
]

_COUNT_BLOCK = 1024
_FILL_BLOCK = 1024
#: the scan holds one lane per expert; a fixed width keeps one compiled variant for every local
#: expert count up to this (V4-Pro has 384 routed experts), whatever the EP split.
MAX_EXPERTS = 512
#: up to this many slots (T*k) the whole routing runs in one CTA, one launch instead of four
#: (a memset and three kernels); decode latency is dominated by launches, not work.
FUSED_MAX_SLOTS = 4096
#: warps of the one-CTA kernel. Fewer are slower although one warp needs no shared memory and
#: 3 CTA barriers instead of 14 (H100, V4-Flash T = 1, one launch: 7.2 µs at 8 warps, 7.8 at 4,
#: 27.3 at 1; 16 warps 7.5, faster only from T = 64 on; ``benchmarks/dev/routing_warps.py``,
#: DESIGN.md section 8, "In place").
FUSED_NUM_WARPS = 8
#: up to this many slots, and no more than one tile's rows, the one-CTA routing may run as the
#: *direct* kernel (``DIRECT_ROUTING``): one pass unrolled over the slots, each slot's id read
#: as a scalar by every thread and its share added to per-slot and per-expert vectors
#: elementwise, so no atomics, no shared memory, no CTA barrier and no shuffle (PTX at 8 warps:
#: 0 / 0 / 0 / 0 against the four-phase kernel's 8 atomics, 14 barriers, 36 shuffles;
#: ``benchmarks/dev/routing_ptx.py``). Every expert then holds one tile (its rows fit one), so
#: its segment starts at ``block_m`` times the distinct local experts below it. The layout it
#: writes is the four-phase kernel's, slots inside a segment in slot order.
DIRECT_MAX_SLOTS = 16
#: whether decode calls whose slots fit (:func:`direct_routing_fits`: one token of top-6 at the
#: 8-row tile) take the direct kernel. Off until timed against the four-phase kernel on a GPU,
#: alone and in place (``bash benchmarks/dev/gpu_suite.sh setup routing``); the routing and
#: MoE GPU tests run it either way.
DIRECT_ROUTING = False


def hot_experts_bound(num_slots: int, num_experts: int, hot: HotClass | None) -> int:
    """At most this many experts can be hot: each has at least ``hot.min_rows`` slots."""
    if hot is None:
        return 0
    return min(num_experts, num_slots // hot.min_rows)


def hot_region_rows(num_slots: int, num_experts: int, hot: HotClass | None) -> int:
    """Rows at the end of the buffer that can hold hot segments: ``N`` real rows and at most
    ``hot.block_m - 1`` padding rows per possible hot expert, rounded to the hot tile."""
    if hot is None:
        return 0
    bound = num_slots + hot_experts_bound(num_slots, num_experts, hot) * (hot.block_m - 1)
    return triton.cdiv(bound, hot.block_m) * hot.block_m


def padded_rows(num_slots: int, num_experts: int, block_m: int,
                hot: HotClass | None = None) -> int:
    """Static row count ``P`` of the padded, expert-grouped buffer (see module docstring):
    ``N`` real rows, at most ``block_m - 1`` padding rows per non-empty expert, and
    ``hot.block_m - block_m`` more per expert that can be hot; a multiple of both tiles."""
    bound = num_slots + min(num_experts, num_slots) * (block_m - 1)
    tile = block_m
    if hot is not None:
        bound += hot_experts_bound(num_slots, num_experts, hot) * (hot.block_m - block_m)
        tile = hot.block_m
    return triton.cdiv(bound, tile) * tile


def _int32_buffers(device: torch.device, *sizes: int) -> list[torch.Tensor]:
    """Uninitialised int32 tensors of the given lengths, views of one allocation (one
    allocator call per routing instead of six). Each starts 16-byte aligned, as a fresh
    allocation does, so the kernels' pointer specialisation (and the compiled variant) is the
    same."""
    padded = [-(-n // 4) * 4 for n in sizes]
    buf = torch.empty(sum(padded), dtype=torch.int32, device=device)
    views, start = [], 0
    for n, p in zip(sizes, padded, strict=True):
        views.append(buf[start:start + n])
        start += p
    return views


def routing_buffers(device: torch.device, num_slots: int, num_experts: int,
                    block_m: int, hot: HotClass | None = None,
                    fused: bool | None = None) -> tuple[torch.Tensor, ...]:
    """The int32 buffers :func:`moe_routing` writes for ``N = num_slots`` slots, ``E`` local
    experts, ``block_m`` and the ``hot`` class (uninitialised, views of one allocation):
    ``expert_offsets [E + 1]``, ``tile_expert [P1 / block_m]``, ``tile_rows [P1 / block_m]``
    (``P1``: the rows without the hot class, which base segments never pass), ``sorted_slots
    [P]``, ``slot_row [N]``, the kernels' own scratch, then the hot class's ``tile_expert``
    and ``tile_rows`` ``[R / hot.block_m]`` over the last ``R`` rows (:func:`hot_region_rows`;
    empty without one). ``fused``: for the one-CTA kernel (default: when ``N <=
    FUSED_MAX_SLOTS``, as :func:`moe_routing`). A caller that runs the routing repeatedly for
    the same sizes on one stream may reuse them (each call rewrites all)."""
    # base tiles cover the one-tile bound (base segments never reach past it), hot tiles the
    # hot region at the end
    num_rows = padded_rows(num_slots, num_experts, block_m, hot)
    num_tiles = padded_rows(num_slots, num_experts, block_m) // block_m
    hot_tiles = hot_region_rows(num_slots, num_experts, hot) // hot.block_m if hot else 0
    # the fused kernel's scratch (counts, cursors), or the multi-kernel path's write cursors
    if fused is None:
        fused = num_slots <= FUSED_MAX_SLOTS
    work = 2 * _e_pad(num_experts) if fused else num_experts
    return tuple(_int32_buffers(device, num_experts + 1, num_tiles, num_tiles, num_rows,
                                num_slots, work, hot_tiles, hot_tiles))


def _e_pad(num_experts: int) -> int:
    return max(MAX_EXPERTS, triton.next_power_of_2(num_experts))


class HotClass(NamedTuple):
    """The second token tile of a MoE call (module docstring, "Hot experts"): an expert with
    ``rows >= min_rows`` whose rows cost less in ``block_m``-row tiles than in the base tile
    (``ceil(rows / block_m) * cost < ceil(rows / base) * base_cost``; costs in integer units,
    :data:`nvfp4_ops.kernels.dispatch.MOE_TILE_COST` x 100) takes this tile."""

    block_m: int
    min_rows: int
    cost: int
    base_cost: int


class MoERouting(NamedTuple):
    """Routing metadata for one MoE call (all int32, on the device of ``topk_ids``).
    ``hot_tile_expert`` / ``hot_tile_rows`` ``[R // hot_block_m]`` describe the hot class's
    tiles over the last ``R = P - hot_row0`` rows (:func:`hot_region_rows`; empty,
    ``hot_block_m = 0``, without one)."""

    sorted_slots: torch.Tensor  # [P]
    expert_offsets: torch.Tensor  # [E + 1]
    tile_expert: torch.Tensor  # [P1 // block_m], P1 = padded_rows without the hot class
    slot_row: torch.Tensor  # [T * k]
    block_m: int
    tile_rows: torch.Tensor  # [P1 // block_m]
    hot_tile_expert: torch.Tensor | None = None
    hot_tile_rows: torch.Tensor | None = None
    hot_block_m: int = 0
    hot_row0: int = 0  # first row of the hot region (hot tile 0)


@triton.jit(do_not_specialize=["num_slots", "expert_start", "num_experts"])
def _count_kernel(topk_ids_ptr, counts_ptr, num_slots, expert_start, num_experts,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    _count(topk_ids_ptr, counts_ptr, offs, num_slots, expert_start, num_experts)


@triton.jit
def _scan(counts_ptr, cursor_ptr, expert_offsets_ptr, tile_expert_ptr, tile_rows_ptr,
          hot_tile_expert_ptr, hot_tile_rows_ptr, sorted_slots_ptr, num_slots, num_rows,
          num_tiles, num_experts, hot_min_rows, hot_cost, base_cost, hot_row0, num_hot_tiles,
          E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_M_HOT: tl.constexpr,
          FILL_BLOCK: tl.constexpr):
    e = tl.arange(0, E_PAD)
    is_expert = e < num_experts
    # volatile: in the fused kernel the counts were just produced by atomics (L2) in this CTA
    counts = tl.load(counts_ptr + e, mask=is_expert, other=0, volatile=True)
    base_tiles = (counts + (BLOCK_M - 1)) // BLOCK_M
    hot_tiles = (counts + (BLOCK_M_HOT - 1)) // BLOCK_M_HOT
    hot = (counts >= hot_min_rows) & (hot_tiles * hot_cost < base_tiles * base_cost)
    padded = tl.where(hot, 0, base_tiles * BLOCK_M)
    padded_hot = tl.where(hot, hot_tiles * BLOCK_M_HOT, 0)
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    total = tl.sum(padded, 0)
    # hot segments are laid out downwards from the last row, in expert order
    hot_starts = num_rows - tl.cumsum(padded_hot, 0)
    total_hot = tl.sum(padded_hot, 0)
    starts = tl.where(hot, hot_starts, starts)
    tl.store(expert_offsets_ptr + e, starts, mask=is_expert)
    tl.store(expert_offsets_ptr + num_experts + e * 0, total, mask=e == 0)
    tl.store(cursor_ptr + e, starts, mask=is_expert)
    # Each expert (one lane) writes the tiles of its segment in its class's tile list, one
    # tile per step; then each list marks its free tiles: base tiles past the last base
    # segment, hot tiles below the lowest hot segment (hot tiles count from row hot_row0)
    _segment_tiles(tile_expert_ptr, tile_rows_ptr, e, counts, starts // BLOCK_M,
                   tl.where(hot, 0, base_tiles), BLOCK_M)
    _segment_tiles(hot_tile_expert_ptr, hot_tile_rows_ptr, e, counts,
                   (starts - hot_row0) // BLOCK_M_HOT, tl.where(hot, hot_tiles, 0), BLOCK_M_HOT)
    _free_tiles(tile_expert_ptr, tile_rows_ptr, total // BLOCK_M, num_tiles, num_tiles,
                FILL_BLOCK)
    _free_tiles(hot_tile_expert_ptr, hot_tile_rows_ptr, 0,
                num_hot_tiles - total_hot // BLOCK_M_HOT, num_hot_tiles, FILL_BLOCK)
    # and the sentinel in every row
    sentinel = tl.full([FILL_BLOCK], 0, tl.int32) + num_slots
    for r0 in range(0, num_rows, FILL_BLOCK):
        rows = r0 + tl.arange(0, FILL_BLOCK)
        tl.store(sorted_slots_ptr + rows, sentinel, mask=rows < num_rows)


@triton.jit
def _segment_tiles(tile_expert_ptr, tile_rows_ptr, e, counts, first_tile, seg_tiles,
                   TILE: tl.constexpr):
    """Lane ``e`` writes its ``seg_tiles`` tiles from ``first_tile`` (expert id, real rows): as
    many steps as the largest segment has tiles (1-2 at decode), not a pass over every tile."""
    for i in range(0, tl.max(seg_tiles, 0)):
        has = i < seg_tiles
        tl.store(tile_expert_ptr + first_tile + i, e, mask=has)
        tl.store(tile_rows_ptr + first_tile + i, tl.minimum(counts - i * TILE, TILE), mask=has)


@triton.jit
def _free_tiles(tile_expert_ptr, tile_rows_ptr, lo, hi, num_tiles, FILL_BLOCK: tl.constexpr):
    """Tiles ``[lo, hi)`` of a list of ``num_tiles`` hold no rows: expert -1, 0 rows."""
    for t0 in range(0, num_tiles, FILL_BLOCK):
        tiles = t0 + tl.arange(0, FILL_BLOCK)
        free = (tiles >= lo) & (tiles < hi)
        tl.store(tile_expert_ptr + tiles, tl.full([FILL_BLOCK], -1, tl.int32), mask=free)
        tl.store(tile_rows_ptr + tiles, tl.zeros([FILL_BLOCK], tl.int32), mask=free)


@triton.jit
def _count(topk_ids_ptr, counts_ptr, offs, num_slots, expert_start, num_experts):
    in_range = offs < num_slots
    ids = tl.load(topk_ids_ptr + offs, mask=in_range, other=-1).to(tl.int64)
    local = ids - expert_start
    is_local = in_range & (local >= 0) & (local < num_experts)
    local32 = tl.where(is_local, local, 0).to(tl.int32)
    tl.atomic_add(counts_ptr + local32, tl.where(is_local, 1, 0).to(tl.int32), mask=is_local)


@triton.jit
def _place(topk_ids_ptr, cursor_ptr, sorted_slots_ptr, slot_row_ptr, offs, num_slots,
           expert_start, num_experts):
    in_range = offs < num_slots
    ids = tl.load(topk_ids_ptr + offs, mask=in_range, other=-1).to(tl.int64)
    local = ids - expert_start
    is_local = in_range & (local >= 0) & (local < num_experts)
    local32 = tl.where(is_local, local, 0).to(tl.int32)
    row = tl.atomic_add(cursor_ptr + local32, tl.where(is_local, 1, 0).to(tl.int32),
                        mask=is_local)
    tl.store(sorted_slots_ptr + row, offs.to(tl.int32), mask=is_local)
    tl.store(slot_row_ptr + offs, tl.where(is_local, row, -1), mask=in_range)


_SCAN_RUNTIME = ["num_slots", "num_rows", "num_tiles", "num_experts", "hot_min_rows",
                 "hot_cost", "base_cost", "hot_row0", "num_hot_tiles"]


@triton.jit(do_not_specialize=_SCAN_RUNTIME)
def _scan_kernel(counts_ptr, cursor_ptr, expert_offsets_ptr, tile_expert_ptr, tile_rows_ptr,
                 hot_tile_expert_ptr, hot_tile_rows_ptr, sorted_slots_ptr, num_slots,
                 num_rows, num_tiles, num_experts, hot_min_rows, hot_cost, base_cost,
                 hot_row0, num_hot_tiles, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_M_HOT: tl.constexpr, FILL_BLOCK: tl.constexpr):
    _scan(counts_ptr, cursor_ptr, expert_offsets_ptr, tile_expert_ptr, tile_rows_ptr,
          hot_tile_expert_ptr, hot_tile_rows_ptr, sorted_slots_ptr, num_slots, num_rows,
          num_tiles, num_experts, hot_min_rows, hot_cost, base_cost, hot_row0, num_hot_tiles,
          E_PAD, BLOCK_M, BLOCK_M_HOT, FILL_BLOCK)


@triton.jit(do_not_specialize=["expert_start", *_SCAN_RUNTIME])
def _fused_routing_kernel(topk_ids_ptr, scratch_ptr, expert_offsets_ptr, tile_expert_ptr,
                          tile_rows_ptr, hot_tile_expert_ptr, hot_tile_rows_ptr,
                          sorted_slots_ptr, slot_row_ptr, num_slots, expert_start,
                          num_experts, num_rows, num_tiles, hot_min_rows, hot_cost, base_cost,
                          hot_row0, num_hot_tiles, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_M_HOT: tl.constexpr, FILL_BLOCK: tl.constexpr,
                          BLOCK: tl.constexpr, PDL: tl.constexpr):
    """All of the routing in one CTA (small N: decode): zero counts, count, scan, place, with
    CTA barriers between the phases (a barrier orders this CTA's global accesses). ``PDL``:
    let the gather launch now (it waits for this kernel before reading anything)."""
    if PDL:
        _pdl.gdc_launch_dependents()
    counts_ptr = scratch_ptr
    cursor_ptr = scratch_ptr + E_PAD
    tl.store(counts_ptr + tl.arange(0, E_PAD), tl.zeros([E_PAD], dtype=tl.int32))
    tl.debug_barrier()
    for s0 in range(0, num_slots, BLOCK):
        _count(topk_ids_ptr, counts_ptr, s0 + tl.arange(0, BLOCK), num_slots, expert_start,
               num_experts)
    tl.debug_barrier()
    _scan(counts_ptr, cursor_ptr, expert_offsets_ptr, tile_expert_ptr, tile_rows_ptr,
          hot_tile_expert_ptr, hot_tile_rows_ptr, sorted_slots_ptr, num_slots, num_rows,
          num_tiles, num_experts, hot_min_rows, hot_cost, base_cost, hot_row0, num_hot_tiles,
          E_PAD, BLOCK_M, BLOCK_M_HOT, FILL_BLOCK)
    tl.debug_barrier()
    for s0 in range(0, num_slots, BLOCK):
        _place(topk_ids_ptr, cursor_ptr, sorted_slots_ptr, slot_row_ptr,
               s0 + tl.arange(0, BLOCK), num_slots, expert_start, num_experts)


_DIRECT_RUNTIME = ["num_slots", "expert_start", "num_experts", "num_rows", "num_tiles",
                   "num_hot_tiles"]


@triton.jit
def _slot_expert(topk_ids_ptr, slot: tl.constexpr, num_slots, expert_start, num_experts):
    """Slot ``slot``'s local expert (int64 scalar) and whether it is local."""
    gid = tl.load(topk_ids_ptr + slot, mask=slot < num_slots, other=-1).to(tl.int64)
    local = gid - expert_start
    return local, (slot < num_slots) & (local >= 0) & (local < num_experts)


@triton.jit(do_not_specialize=_DIRECT_RUNTIME)
def _direct_routing_kernel(topk_ids_ptr, expert_offsets_ptr, tile_expert_ptr, tile_rows_ptr,
                           hot_tile_expert_ptr, hot_tile_rows_ptr, sorted_slots_ptr,
                           slot_row_ptr, num_slots, expert_start, num_experts, num_rows,
                           num_tiles, num_hot_tiles, SLOTS: tl.constexpr, E_PAD: tl.constexpr,
                           BLOCK_M: tl.constexpr, FILL_BLOCK: tl.constexpr,
                           PDL: tl.constexpr):
    """The routing of at most ``SLOTS`` slots, no more than ``BLOCK_M`` (``DIRECT_MAX_SLOTS``),
    in one pass without atomics, reductions across threads or barriers: a loop unrolled over
    the slots reads each slot's id as a scalar (every thread the same), decides whether it
    is its expert's first slot (no earlier slot holds that expert), and adds its share to
    per-slot and per-expert vectors elementwise. Slot ``i``'s expert then has ``rank``
    distinct local experts below it and holds one tile (its rows fit one), and ``i`` is its
    ``occ``-th slot, so its row is ``rank * BLOCK_M + occ``; each output is written by one
    thread, the tile list and ``sorted_slots`` by scatters and by fills of the entries no
    scatter reaches. No expert is hot (the caller checks that none can be): every hot tile
    is free."""
    if PDL:
        _pdl.gdc_launch_dependents()
    s = tl.arange(0, SLOTS)
    in_range = s < num_slots
    ids = tl.load(topk_ids_ptr + s, mask=in_range, other=-1).to(tl.int64)
    local = ids - expert_start
    is_local = in_range & (local >= 0) & (local < num_experts)
    e = tl.arange(0, E_PAD)
    occ = tl.zeros([SLOTS], tl.int32)  # earlier slots of the same expert
    mult = tl.zeros([SLOTS], tl.int32)  # slots of the same expert
    rank = tl.zeros([SLOTS], tl.int32)  # distinct local experts below this slot's
    below = tl.zeros([E_PAD], tl.int32)  # distinct local experts below e
    distinct = 0
    for i in tl.static_range(SLOTS):
        local_i, local_ok = _slot_expert(topk_ids_ptr, i, num_slots, expert_start, num_experts)
        first = local_ok
        for j in tl.static_range(i):
            local_j, ok_j = _slot_expert(topk_ids_ptr, j, num_slots, expert_start, num_experts)
            first = first & ~(ok_j & (local_j == local_i))
        same = is_local & local_ok & (local == local_i)
        occ += (same & (s > i)).to(tl.int32)
        mult += same.to(tl.int32)
        rank += (is_local & first & (local_i < local)).to(tl.int32)
        below += (first & (local_i < e)).to(tl.int32)
        distinct += first.to(tl.int32)
    row = rank * BLOCK_M + occ
    tl.store(slot_row_ptr + s, tl.where(is_local, row, -1), mask=in_range)
    tl.store(expert_offsets_ptr + e, below * BLOCK_M, mask=e < num_experts)
    tl.store(expert_offsets_ptr + num_experts + e * 0, distinct * BLOCK_M + e * 0, mask=e == 0)
    # the first slot of each expert writes its tile; the tiles past the last one are free
    first_slot = is_local & (occ == 0)
    tl.store(tile_expert_ptr + rank, local.to(tl.int32), mask=first_slot)
    tl.store(tile_rows_ptr + rank, mult, mask=first_slot)
    _free_tiles(tile_expert_ptr, tile_rows_ptr, distinct, num_tiles, num_tiles, FILL_BLOCK)
    _free_tiles(hot_tile_expert_ptr, hot_tile_rows_ptr, 0, num_hot_tiles, num_hot_tiles,
                FILL_BLOCK)
    # each local slot its row; the sentinel in the rest of its tile and past the last tile
    tl.store(sorted_slots_ptr + row, s, mask=is_local)
    pad = tl.arange(0, BLOCK_M)
    tl.store(sorted_slots_ptr + (rank * BLOCK_M)[:, None] + pad[None, :],
             tl.full([SLOTS, BLOCK_M], 0, tl.int32) + num_slots,
             mask=first_slot[:, None] & (pad[None, :] >= mult[:, None]))
    for r0 in range(distinct * BLOCK_M, num_rows, FILL_BLOCK):
        r = r0 + tl.arange(0, FILL_BLOCK)
        tl.store(sorted_slots_ptr + r, tl.full([FILL_BLOCK], 0, tl.int32) + num_slots,
                 mask=r < num_rows)


@triton.jit(do_not_specialize=["num_slots", "expert_start", "num_experts"])
def _place_kernel(topk_ids_ptr, cursor_ptr, sorted_slots_ptr, slot_row_ptr, num_slots,
                  expert_start, num_experts, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    _place(topk_ids_ptr, cursor_ptr, sorted_slots_ptr, slot_row_ptr, offs, num_slots,
           expert_start, num_experts)


@triton.jit(do_not_specialize=["num_slots", "num_tiles", "hot_tile0"])
def _gather_kernel(hidden_ptr, topk_weights_ptr, sorted_slots_ptr, tile_expert_ptr,
                   hot_tile_expert_ptr, a_ptr, row_scale_ptr, num_slots, num_tiles,
                   hot_tile0,
                   HIDDEN: tl.constexpr, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_H: tl.constexpr, PERM_ROWS: tl.constexpr, HOT_RATIO: tl.constexpr,
                   PDL: tl.constexpr):
    if PDL:
        _pdl.gdc_wait()
        _pdl.gdc_launch_dependents()
    tile = tl.program_id(0)
    col_block = tl.program_id(1)
    # a row of a base tile (the base tiles cover the first num_tiles units), or of a hot
    # tile (HOT_RATIO units each, counted from unit hot_tile0)
    used = tl.load(tile_expert_ptr + tile, mask=tile < num_tiles, other=-1) >= 0
    if HOT_RATIO > 0:
        hot = tl.maximum(tile - hot_tile0, 0) // HOT_RATIO
        used = used | ((tile >= hot_tile0)
                       & (tl.load(hot_tile_expert_ptr + hot, mask=tile >= hot_tile0,
                                  other=-1) >= 0))
    if used:
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        slots = tl.load(sorted_slots_ptr + rows)
        real = slots < num_slots
        token = tl.where(real, slots, 0) // TOP_K
        cols = col_block * BLOCK_H + tl.arange(0, BLOCK_H)
        col_ok = cols < HIDDEN
        src = hidden_ptr + token.to(tl.int64)[:, None] * HIDDEN + cols[None, :]
        vals = tl.load(src, mask=real[:, None] & col_ok[None, :], other=0.0)
        if PERM_ROWS > 0:
            # both permuted layouts (orders/kperm.py) transpose blocks of 4 R k seen as [R, 4]
            # (k = 4a + b stored at position R b + a): R = 8 is ``kperm`` (32-blocks), R = 2
            # ``pair`` (8-blocks: position 2b + a holds k b + 4a). In registers, so loads and
            # stores stay contiguous
            vals = tl.reshape(vals, (BLOCK_M, BLOCK_H // (4 * PERM_ROWS), PERM_ROWS, 4))
            vals = tl.reshape(tl.permute(vals, (0, 1, 3, 2)), (BLOCK_M, BLOCK_H))
        dst = a_ptr + rows.to(tl.int64)[:, None] * HIDDEN + cols[None, :]
        tl.store(dst, vals, mask=col_ok[None, :])
        if col_block == 0:
            w = tl.load(topk_weights_ptr + tl.where(real, slots, 0), mask=real, other=0.0)
            tl.store(row_scale_ptr + rows, w.to(tl.float32))


#: the decode-path launches, through the low-overhead launcher (:mod:`._launch`)
_fused_routing = Launcher(_fused_routing_kernel)
_direct_routing = Launcher(_direct_routing_kernel)
#: rows and tiles per step of the direct kernel's fill loops
_DIRECT_FILL_BLOCK = 64
_gather = Launcher(_gather_kernel)


def _layout(topk_ids: torch.Tensor, num_experts: int, block_m: int,
            buffers: tuple[torch.Tensor, ...] | None, hot: HotClass | None,
            fused: bool) -> tuple[MoERouting, tuple[torch.Tensor, ...], tuple]:
    """The routing a call will write (its buffers, allocated when ``buffers`` is None), the
    buffers, and the scan's hot-class arguments ``(min_rows, cost, base_cost, hot_row0,
    hot tiles)``."""
    num_slots = topk_ids.numel()
    if buffers is None:
        buffers = routing_buffers(topk_ids.device, num_slots, num_experts, block_m, hot,
                                  fused)
    expert_offsets, tile_expert, tile_rows, sorted_slots, slot_row, _, hot_expert, hot_rows = (
        buffers)
    # the sizes routing_buffers chose (padded_rows, hot_region_rows), read off its buffers
    num_rows = sorted_slots.shape[0]
    hot_row0 = num_rows - (hot_expert.shape[0] * hot.block_m if hot is not None else 0)
    if hot is None:  # no expert qualifies (min_rows above every count); one tile's variant
        hot_args = (num_slots + 1, 0, 0, num_rows, 0)
    else:
        hot_args = (hot.min_rows, hot.cost, hot.base_cost, hot_row0, hot_expert.shape[0])
    result = MoERouting(sorted_slots, expert_offsets, tile_expert, slot_row, block_m,
                        tile_rows, hot_expert, hot_rows, 0 if hot is None else hot.block_m,
                        hot_row0)
    return result, buffers, hot_args


def direct_routing_fits(num_slots: int, block_m: int, hot: HotClass | None) -> bool:
    """Whether ``num_slots`` slots can take the direct kernel (``DIRECT_MAX_SLOTS``): at least
    one slot, at most ``min(block_m, DIRECT_MAX_SLOTS)`` of them (every expert's rows fit one
    tile), and too few for any expert to be hot."""
    return (0 < num_slots <= min(block_m, DIRECT_MAX_SLOTS)
            and (hot is None or num_slots < hot.min_rows))


def takes_direct_routing(num_slots: int, block_m: int, hot: HotClass | None) -> bool:
    """Whether the one-CTA routing of these slots runs as the direct kernel: ``DIRECT_ROUTING``
    on and the slots fit it (:func:`direct_routing_fits`). The one place that decides it
    (:func:`routing_launch`, and the warm-up that must compile what it will launch)."""
    return DIRECT_ROUTING and direct_routing_fits(num_slots, block_m, hot)


def routing_launch(topk_ids: torch.Tensor, num_experts: int, expert_start: int,
                   block_m: int, pdl: bool = False,
                   buffers: tuple[torch.Tensor, ...] | None = None,
                   hot: HotClass | None = None) -> tuple[MoERouting, Launch]:
    """The one-CTA routing (``N <= FUSED_MAX_SLOTS``) as a launch not yet made, and the
    routing it writes; arguments as :func:`moe_routing`. Where :func:`takes_direct_routing`
    the launch is the direct kernel, otherwise the four-phase one. Either takes ``topk_ids``
    as ``topk_ids_ptr`` (what a :class:`~._launch.BoundLaunch` of it replaces per call, with
    ``expert_start``)."""
    result, buffers, hot_args = _layout(topk_ids, num_experts, block_m, buffers, hot, True)
    (expert_offsets, tile_expert, tile_rows, sorted_slots, slot_row, scratch, hot_expert,
     hot_rows) = buffers
    pdl = bool(pdl and topk_ids.is_cuda)
    if takes_direct_routing(topk_ids.numel(), block_m, hot):
        args = (topk_ids, expert_offsets, tile_expert, tile_rows, hot_expert, hot_rows,
                sorted_slots, slot_row, topk_ids.numel(), expert_start, num_experts,
                sorted_slots.shape[0], tile_expert.shape[0], hot_expert.shape[0],
                DIRECT_MAX_SLOTS, _e_pad(num_experts), block_m, _DIRECT_FILL_BLOCK, pdl)
        return result, Launch(_direct_routing, (1, 1, 1), args,
                              {"num_warps": FUSED_NUM_WARPS})
    # topk_ids is contiguous: the kernel indexes its T*k ids flat
    args = (topk_ids, scratch, expert_offsets, tile_expert, tile_rows, hot_expert, hot_rows,
            sorted_slots, slot_row, topk_ids.numel(), expert_start, num_experts,
            sorted_slots.shape[0], tile_expert.shape[0], *hot_args, _e_pad(num_experts),
            block_m, block_m if hot is None else hot.block_m, _FILL_BLOCK, _COUNT_BLOCK, pdl)
    return result, Launch(_fused_routing, (1, 1, 1), args, {"num_warps": FUSED_NUM_WARPS})


def moe_routing(topk_ids: torch.Tensor, num_experts: int, expert_start: int,
                block_m: int, pdl: bool = False,
                buffers: tuple[torch.Tensor, ...] | None = None,
                hot: HotClass | None = None, fused: bool | None = None) -> MoERouting:
    """Expert-grouped, padded row layout for ``topk_ids`` (see the module docstring).

    Args:
        topk_ids: ``int32/int64 [T, k]`` contiguous, *global* expert ids. Ids outside
            ``[expert_start, expert_start + num_experts)`` are dropped (not local), whatever
            their value, so a skipped range check cannot cause an out-of-bounds access.
        num_experts: local experts ``E``.
        expert_start: first global id owned here.
        block_m: tile rows; every segment is padded to a multiple of it.
        pdl: the single-CTA kernel (decode) lets the next kernel launch early (:mod:`._pdl`).
        buffers: what :func:`routing_buffers` returns for these sizes (written over); None
            allocates them.
        hot: the second token tile for experts with many rows (module docstring, "Hot
            experts"); None for one tile.
        fused: run the one-CTA kernel (True) or the four launches (False); None: the one-CTA
            kernel when ``N <= FUSED_MAX_SLOTS`` (warm-up runs both, so neither compiles
            while serving).

    Returns:
        :class:`MoERouting` on ``topk_ids.device``; no host synchronisation.
    """
    num_slots = topk_ids.numel()
    if fused is None:
        fused = num_slots <= FUSED_MAX_SLOTS
    if fused:
        result, launch = routing_launch(topk_ids, num_experts, expert_start, block_m, pdl,
                                        buffers, hot)
        launch()
        return result
    result, buffers, hot_args = _layout(topk_ids, num_experts, block_m, buffers, hot, False)
    (expert_offsets, tile_expert, tile_rows, sorted_slots, slot_row, cursor, hot_expert,
     hot_rows) = buffers
    counts = torch.zeros(num_experts, dtype=torch.int32, device=topk_ids.device)
    slot_grid = (max(1, triton.cdiv(num_slots, _COUNT_BLOCK)),)
    _count_kernel[slot_grid](topk_ids, counts, num_slots, expert_start, num_experts,
                             BLOCK=_COUNT_BLOCK)
    _scan_kernel[(1,)](counts, cursor, expert_offsets, tile_expert, tile_rows, hot_expert,
                       hot_rows, sorted_slots, num_slots, sorted_slots.shape[0],
                       tile_expert.shape[0], num_experts, *hot_args, E_PAD=_e_pad(num_experts),
                       BLOCK_M=block_m, BLOCK_M_HOT=block_m if hot is None else hot.block_m,
                       FILL_BLOCK=_FILL_BLOCK, num_warps=8)
    _place_kernel[slot_grid](topk_ids, cursor, sorted_slots, slot_row, num_slots, expert_start,
                             num_experts, BLOCK=_COUNT_BLOCK)
    return result


def gather_launch(hidden: torch.Tensor, topk_weights: torch.Tensor, routing: MoERouting,
                  layout: str = NATURAL, pdl: bool = False,
                  out: tuple[torch.Tensor, torch.Tensor] | None = None,
                  ) -> tuple[tuple[torch.Tensor, torch.Tensor], Launch]:
    """:func:`gather_rows` as a launch not yet made, and the ``(a, row_scale)`` it writes;
    arguments as :func:`gather_rows`. The kernel takes ``hidden`` and ``topk_weights`` as
    ``hidden_ptr`` and ``topk_weights_ptr``."""
    num_tokens, hidden_size = hidden.shape
    top_k = topk_weights.shape[1]
    block = layout_block(layout)
    if hidden_size % block:
        raise ValueError(f"the {layout!r} layout needs H % {block} == 0, got H={hidden_size}")
    num_rows = routing.sorted_slots.shape[0]
    block_m = routing.block_m
    if out is None:
        a = torch.empty(num_rows, hidden_size, dtype=hidden.dtype, device=hidden.device)
        row_scale = torch.empty(num_rows, dtype=torch.float32, device=hidden.device)
    else:
        a, row_scale = out
    block_h = min(1024, triton.next_power_of_2(hidden_size))
    # Keep the register tile around 8K elements whatever block_m is.
    block_h = max(64, min(block_h, 8192 // block_m))
    pdl = bool(pdl and hidden.is_cuda)
    hot_ratio = routing.hot_block_m // block_m
    grid = (num_rows // block_m, triton.cdiv(hidden_size, block_h), 1)
    args = (hidden, topk_weights, routing.sorted_slots, routing.tile_expert,
            routing.hot_tile_expert if hot_ratio else routing.tile_expert, a, row_scale,
            num_tokens * top_k, routing.tile_expert.shape[0], routing.hot_row0 // block_m,
            hidden_size, top_k, block_m, block_h, block // 4 if block > 1 else 0, hot_ratio,
            pdl)
    return (a, row_scale), Launch(_gather, grid, args, _pdl.launch_kwargs(pdl))


def gather_rows(hidden: torch.Tensor, topk_weights: torch.Tensor, routing: MoERouting,
                layout: str = NATURAL, pdl: bool = False,
                out: tuple[torch.Tensor, torch.Tensor] | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The GEMM-1 input and the GEMM-2 row scales in the padded row order.

    Args:
        hidden: ``bf16 [T, H]`` contiguous.
        topk_weights: ``float32 [T, k]`` contiguous.
        routing: from :func:`moe_routing` for the same ``T, k``.
        layout: the column order of ``a``, a name of :data:`nvfp4_ops.orders.kperm.LAYOUTS`
            (the MoE plan's ``act_order``: what its GEMM 1 reads; ``H`` a multiple of the
            layout's block: 32 for ``kperm``, 8 for ``pair``).
        pdl: launch with programmatic dependent launch (:mod:`._pdl`; CUDA only).
        out: ``(a, row_scale)`` to write (contiguous, the shapes below); None allocates them.

    Returns:
        ``a bf16 [P, H]`` (token rows, zeros in padding rows) and ``row_scale f32 [P]``
        (router weight of each row, 0 in padding rows). Rows of tiles past the last segment
        are left uninitialised: no GEMM tile reads or writes them.

    Raises:
        ValueError: an unknown layout, or ``H`` not a multiple of its block.
    """
    written, launch = gather_launch(hidden, topk_weights, routing, layout, pdl, out)
    launch()
    return written
