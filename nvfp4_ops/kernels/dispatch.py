"""The dispatch policy: one place that turns an op's static sizes and its weights' order into a
frozen plan (kernel family, config, activation order). Nothing else picks a kernel, and no
config is rewritten after it is built.

Inputs are static (shapes, never data), so a plan is a pure, cached function of them and the
same call always launches the same binaries: CUDA-graph capture and replay see fixed grids.

The rules, in the order they are applied (the measurements behind each are in
``nvfp4_ops/kernels/DESIGN.md``):

=====================  ===========================================================================
token tile             dense: the smallest of 8/16/32/64 that holds M, then 128 up to 256 tokens,
                       256 beyond (:func:`dense_block_m`). MoE: the tile of least expected cost
                       (tiles each expert needs under uniform routing x the measured cost of
                       a tile, :func:`moe_block_m`) for the rank's expected share of the
                       slots (:func:`local_slots`), lowered to one both grouped GEMMs cover.
family                 8-token tiles: the streamed decode kernel (``w4a16_stream``); dense 16/32:
                       ``mma.sync`` (``w4a16_gemm``); grouped 16/32 and everything from 64:
                       WGMMA (``w4a16_wgmma``). A family that does not cover the shape falls back
                       to ``mma.sync`` (dense: at its largest tile).
prepared dense weights dense ``none`` problems on ``wfrag`` weights with at least
(WeightOrder.WFRAG)    :data:`STREAMK_MIN_K_TILES` 64-k tiles per CTA run the stream-K WGMMA tile
                       at 16, 32 and 128 tokens (:data:`STREAMK_TILES`, 128-k stages); other
                       16/32-token problems with N >= 2 * 64 * SMs the one-warpgroup 6-stage
                       WGMMA tile; streamed 8-token tiles fill their stages with two TMA tensor
                       copies when each CTA streams >= :data:`TMA2D_MIN_CHUNKS` chunks or all
                       CTAs fit one per SM.
MoE activation order   both grouped GEMMs read a permuted k order (``pair`` for streamed tiles,
                       ``kperm`` for WGMMA tiles; :mod:`nvfp4_ops.orders.kperm`) when their
                       families have one; the gather and GEMM 1's epilogue then write it.
tile shapes            per family below: :func:`_stream_fields`, :func:`_mma_fields`,
                       :func:`_wgmma_fields` (dense WGMMA 128/256 by a wave estimate over
                       :data:`DENSE_TILES`; grouped 16/32 by :data:`GROUPED_SMALL_TILES`,
                       grouped 64-256 row warpgroups by :data:`GROUPED_ROW_WGS`, k loop
                       form by :func:`grouped_unroll`; MoE decode,
                       at most :data:`PERSIST_MAX_TILES` token tiles: persistent gate/up CTAs,
                       and a down GEMM on 4 warps where the rank expects at most
                       :data:`FEW_ROWS_SLOTS` slots; past decode on an EP 4+ rank, a down
                       GEMM of persistent CTAs over :data:`DOWN_TILES_CAP` token tiles,
                       :func:`moe_down_tiles_cap`); the MoE's streamed gate/up tiles fill
                       their stages with TMA tensor copies (not MXFP4's persistent one).
=====================  ===========================================================================

Nothing here reads a device: the SM count is the constant :data:`NUM_SMS` (H100/H200 SXM), so
plans (and compiles) need no GPU; on a part with fewer SMs they are only less tuned.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nvfp4_ops.kernels.cute import w4a16_gemm, w4a16_stream, w4a16_wgmma
from nvfp4_ops.kernels.triton.moe_routing import HotClass, hot_experts_bound, padded_rows
from nvfp4_ops.orders import WeightOrder
from nvfp4_ops.orders.kperm import NATURAL

__all__ = [
    "BLOCK_MS",
    "dense_block_m",
    "expected_cost",
    "expected_tiles",
    "expert_cost",
    "gemm_supported",
    "GemmPlan",
    "GROUPED_ROW_WGS",
    "GROUPED_UNROLL_MIN_WEIGHTS",
    "grouped_row_wgs",
    "HotPlan",
    "local_slots",
    "moe_act_orders",
    "moe_block_m",
    "moe_hot_class",
    "MOE_HOT_TILE",
    "MOE_POLICY_TILES",
    "moe_mx_supported",
    "moe_priced_granularity",
    "moe_supported",
    "MOE_TILE_COST",
    "moe_width_cost",
    "moe_wperm_supported",
    "MoEPlan",
    "plan_gemm",
    "plan_linear",
    "plan_mlp",
    "plan_moe",
    "plan_of_config",
    "reachable_plans",
    "WeightOrder",
]


#: every token tile some family serves (dense and grouped; the MoE routing pads to one of these)
BLOCK_MS = (8, 16, 32, 64, 128, 256)
#: SMs of an H100/H200 SXM: the wave size of every estimate here (no device query)
NUM_SMS = 132

_STREAM, _MMA, _WGMMA = "stream", "mma", "wgmma"
_MODULES = {_STREAM: w4a16_stream, _MMA: w4a16_gemm, _WGMMA: w4a16_wgmma}
_CONFIGS = {_STREAM: w4a16_stream.StreamConfig, _MMA: w4a16_gemm.GemmConfig,
            _WGMMA: w4a16_wgmma.WgmmaConfig}
#: the permuted activation order each family reads (:mod:`nvfp4_ops.orders.kperm`; the
#: configs' ``PERMUTED_ORDER``)
_PERMUTED_ORDER = {f: cls.PERMUTED_ORDER for f, cls in _CONFIGS.items() if cls.PERMUTED_ORDER}

# ---------------------------------------------------------------------------- tables

#: dense WGMMA tile shapes ``(row_wgs, split_k)`` per ``block_m`` and their throughput per SM
#: in 64-row weight blocks per µs (one CTA per SM; DESIGN.md, "WGMMA tiles")
DENSE_TILES = {
    128: {(1, 2): 1 / 83.4, (2, 1): 2 / 142.6, (2, 2): 2 / 136.0, (4, 1): 4 / 244.5,
          (3, 1): 3 / 193.1},
    256: {(1, 2): 2 / 239.9, (2, 1): 2 / 203.9},
}
#: grouped ``(block_m, epilogue)`` -> ring stages of the one-row-warpgroup WGMMA tile
GROUPED_SMALL_TILES = {(16, "swiglu"): 4, (32, "swiglu"): 3, (16, "row_scale"): 5,
                       (32, "row_scale"): 4, (16, "none"): 4, (32, "none"): 4}
#: grouped WGMMA tiles of more than two row warpgroups: ``block_m -> (row_wgs, from K)``
#: (others, and smaller K, take two). A 128-row tile holds one CTA per SM (its accumulators
#: need ``setmaxnreg``), so four row warpgroups double the decoding warps per SM and halve the
#: activation reads per weight. A 64-row tile has two CTAs per SM already, and four
#: warpgroups (one CTA) paid only with the longer reductions (the measurements: DESIGN.md
#: section 8, "Row warpgroups of the grouped tiles")
GROUPED_ROW_WGS = {128: (4, 0), 64: (4, 3072)}
#: grouped WGMMA GEMMs of at least this many weights per expert (``N * K``) run their
#: consumers' k loop unrolled by the ring's depth (``WgmmaConfig.unroll``): V4-Pro's two
#: (44 M, 22 M) gained 1-11 % of the whole op at every measured T, routing and EP slice;
#: V4-Flash's (16.8 M, 8.4 M) gained 2-8 % at EP 1 but lost up to 2.4 % on one EP 8 rank,
#: and its 64-row two-warpgroup tile loses occupancy (DESIGN.md section 5), so they unroll
#: only as base tiles beside a hot tile, which runs at EP 1 and 2 only
#: (:func:`grouped_unroll`)
GROUPED_UNROLL_MIN_WEIGHTS = 20 << 20
#: grouped WGMMA tiles ``(block_m, row_wgs)`` that the beside-a-hot-tile rule keeps rolled:
#: V4-Flash's 64-row two-warpgroup down tile needs 125 registers per thread unrolled (75
#: rolled), one CTA per SM instead of two (DESIGN.md section 5)
UNROLL_HALVES_OCCUPANCY = frozenset({(64, 2)})
#: dense token tiles counted past this many are treated as this many (the WGMMA estimate no
#: longer changes), which bounds the configs a dispatch can reach
DENSE_MAX_M_TILES = 16
#: grouped problems with at most this many token tiles (the MoE's padded rows / 8; V4 decode
#: T = 1 has 6) are decode: gate/up runs the streamed kernel with :data:`PERSIST_CTAS`
#: persistent CTAs, and down with 4 consumer warps and 3 stages where the rank expects at
#: most :data:`FEW_ROWS_SLOTS` routed slots
PERSIST_MAX_TILES = 8
PERSIST_CTAS = 3 * NUM_SMS
#: MoE: at most this many expected local slots (:func:`local_slots`; one EP 8 rank at T = 1:
#: 0.75, EP 4: 1.5) is "a few experts' rows", whose down GEMM at decode fills more SMs with
#: 4 consumer warps (DESIGN.md section 3, "Tile shapes")
FEW_ROWS_SLOTS = 2.0
#: MoE: the streamed down GEMM past decode on a rank whose grid is mostly empty token tiles
#: (EP 4 or more: the grid bounds all ``T * k`` slots, the rank expects a share) runs
#: persistent CTAs over at most this many token tiles per feature tile (``StreamConfig.ctas``
#: = feature tiles x this; :func:`moe_down_tiles_cap`) instead of one CTA per grid item, most
#: of which would find their tile empty. On EP 4 and EP 8 ranks at T = 32-256 one CTA per
#: item took 0.999-1.085x the time of this cap on NVFP4 weights and 0.997-1.085x on MXFP4
#: (caps of 24-48 did about as well, 96 worse; DESIGN.md section 10, "An EP rank launches
#: mostly empty CTAs")
DOWN_TILES_CAP = 32
#: MoE: time of one ``block_m``-row token tile (both GEMMs over one expert's weights) relative
#: to an 8-row tile; the op's time is close to (real tiles) x (this) at every T and routing
#: (H200, V4-Flash and V4-Pro, uniform and skewed: DESIGN.md section 8)
MOE_TILE_COST = {8: 1.0, 16: 1.11, 32: 1.35, 64: 1.8, 128: 2.75, 256: 4.3}
#: MoE: the width granularity of each grouped WGMMA tile of several row warpgroups: a CTA runs
#: its tile only as wide as its real rows need, rounded up to a multiple of this
#: (``WgmmaConfig.flex``; DESIGN.md section 8, "Flexible width")
MOE_FLEX = {64: 16, 128: 32, 256: 64}
#: MoE: the narrowest width the tile choice prices a flexible tile's partial last tile at,
#: where a hot class can take the hot experts. A 64-row tile runs 16 wide faster than 32
#: wide, but not as fast as the 16-row tile; priced as one, it took T = 512 at EP 1 from the
#: 16-row tile and was slower there. Without a hot class (a rank with less than half of the
#: slots) the larger flexible tile serves the hot experts too and paid at the narrow price
#: (DESIGN.md section 8, "Flexible width")
MOE_PRICED_WIDTH_MIN = 32
#: a larger token tile must cost this much less than a smaller one to be chosen
MOE_TILE_MARGIN = 0.98
#: MoE: the token tiles the op's policy (flexible widths) chooses among. Not 32: the 64-row
#: tile run 16 / 32 wide (:data:`MOE_FLEX`) took less time than the 32-row tile in 19 of 20
#: measured cells (the whole op at each tile, V4-Flash and V4-Pro, T = 512-2048, EP 1 and one
#: EP 8 rank, both routings; V4-Pro EP 1 T = 1024 uniform 6748 -> 5774 µs), 1.01x more in
#: the last (DESIGN.md section 8, "The token tile: least expected cost"). The pricing alone
#: cannot say so: it prices a 64-row tile's narrow widths as the 32-row tile at best
MOE_POLICY_TILES = (8, 16, 64, 128, 256)
#: MoE: the hot token tile of each base WGMMA tile (experts whose rows cost less in it take
#: it, decided per call on the device: ``moe_routing``, "Hot experts")
MOE_HOT_TILE = {16: 128, 32: 128, 64: 256, 128: 256}
#: stream-K WGMMA tiles on prepared dense weights: ``block_m -> (row_wgs, CTAs per SM)``
STREAMK_TILES = {16: (1, 3), 32: (1, 3), 128: (2, 1)}
#: ring stages of the stream-K tiles (128 k per stage)
STREAMK_STAGES = 4
#: stream-K pays when every CTA gets at least this many 64-k units (the fix-up of partial
#: tiles is then a small part of its work)
STREAMK_MIN_K_TILES = 64
#: streamed 8-token tiles: K chunks per CTA from which two TMA tensor copies per stage pay
TMA2D_MIN_CHUNKS = 16


# ---------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class GemmPlan:
    """What one W4A16 GEMM launch runs: its kernel ``family`` (``stream``, ``mma``,
    ``wgmma``) and the family's frozen ``config`` (the compile key), which holds the weight
    and activation orders the kernel reads."""

    family: str
    config: Any

    @property
    def act_order(self) -> str:
        """The activations' k order: ``natural``, ``pair`` or ``kperm``
        (:mod:`nvfp4_ops.orders.kperm`), the config's."""
        return getattr(self.config, "act_order", NATURAL)

    @property
    def weight_order(self) -> WeightOrder:
        """How the weights' codes are stored: the config's ``order``."""
        return self.config.order

    @property
    def block_m(self) -> int:
        return self.config.block_m

    @property
    def streamk(self) -> bool:
        """Whether the launch needs a stream-K workspace (tile counters and partial sums)."""
        return bool(getattr(self.config, "streamk", 0))


@dataclass(frozen=True)
class HotPlan:
    """The hot experts' token tile of a MoE call: the routing's rule (``routing``) and the
    two grouped GEMMs at that tile (same activation and weight order as the base tile's)."""

    routing: HotClass
    gate_up: GemmPlan
    down: GemmPlan


@dataclass(frozen=True)
class MoEPlan:
    """Everything ``nvfp4::moe`` runs for one set of static sizes.

    ``num_rows``: the padded row count ``P`` of the gathered buffer; ``gate_up`` / ``down``:
    the two grouped GEMMs, which share one token tile, one activation order and one weight
    order; the properties read them from ``gate_up``. ``hot``: the second tile for experts
    with many rows (None: one tile for all), whose GEMMs run after each base GEMM over the
    same buffers. ``chained``: the whole chain (the Triton kernels, and the GEMMs whose family
    can) is launched with launch overlap (``moe_cuda``, "Launch overlap").
    """

    num_rows: int
    gate_up: GemmPlan
    down: GemmPlan
    hot: HotPlan | None = None
    chained: bool = True

    @property
    def block_m(self) -> int:
        """The routing's token tile (every expert segment padded to it)."""
        return self.gate_up.block_m

    @property
    def act_order(self) -> str:
        """The k order the gather and GEMM 1's SwiGLU epilogue write (``natural``, ``pair``
        or ``kperm``)."""
        return self.gate_up.act_order

    @property
    def weight_order(self) -> WeightOrder:
        return self.gate_up.weight_order


# ---------------------------------------------------------------------------- the rules


def dense_block_m(num_tokens: int) -> int:
    """Token tile of a dense GEMM over ``num_tokens`` rows: the smallest of 8/16/32/64 that
    holds them, then 128 up to 256 tokens (one or two tiles; the WGMMA tile shape fills the SMs
    with split-K or row warpgroups), 256 beyond (half the weight decode per token)."""
    for bm in (8, 16, 32, 64):
        if num_tokens <= bm:
            return bm
    return 128 if num_tokens <= 256 else 256


def local_slots(num_slots: int, num_experts: int, global_num_experts: int = -1) -> float:
    """The routed slots expected on this rank: ``num_slots = T * k`` times the rank's share
    ``num_experts / global_num_experts`` of the experts (all of them when the global count is
    unknown, -1, or not larger). An estimate from static sizes only (uniform routing); the
    kernels stay correct for any actual split, since the padded rows and the grids still
    bound all ``num_slots`` slots."""
    if global_num_experts > num_experts > 0:
        return num_slots * num_experts / global_num_experts
    return float(num_slots)


def moe_down_tiles_cap(num_rows: int, block_m: int, slots: float, num_slots: int) -> int:
    """The token tiles per feature tile the MoE's down GEMM walks persistently
    (:data:`DOWN_TILES_CAP`), or 0 for one CTA per grid item: capped where the grid's
    ``num_rows / block_m`` token tiles are at least twice the cap (so a CTA walks two items or
    more) and the rank expects at most a quarter of the ``num_slots`` slots (``slots``: one
    rank of EP 4 or more, whose grid, sized for all of them, is mostly empty). Static sizes
    only; any routing stays correct, since the persistent CTAs walk every item."""
    if num_rows // block_m < 2 * DOWN_TILES_CAP or 4 * slots > num_slots:
        return 0
    return DOWN_TILES_CAP


def _poisson(mean_rows: float):
    """``(x, P(X = x))`` for ``X ~ Poisson(mean_rows)``, ``x >= 1``, over the terms that matter
    (``mean +- 10 sd``), computed in log space."""
    sd = math.sqrt(mean_rows)
    lo, hi = max(0, int(mean_rows - 10 * sd - 10)), int(mean_rows + 10 * sd + 10)
    log_mean = math.log(mean_rows)
    for x in range(max(1, lo), hi + 1):
        yield x, math.exp(x * log_mean - mean_rows - math.lgamma(x + 1))


def expected_tiles(mean_rows: float, block_m: int) -> float:
    """``E[ceil(X / block_m)]`` for ``X ~ Poisson(mean_rows)``: the token tiles one expert needs
    on average when its rows arrive as uniform routing spreads them (an expert with no row
    needs none)."""
    if mean_rows <= 0:
        return 0.0
    return sum(p * -(-x // block_m) for x, p in _poisson(mean_rows))


def moe_width_cost(width: int, costs: Mapping[int, float] = MOE_TILE_COST) -> float:
    """The tile cost (``costs``: :data:`MOE_TILE_COST`, or a table being fitted) of a tile run
    ``width`` tokens wide, linear between the measured tiles (a flexible-width tile's last,
    partial tile)."""
    keys = sorted(costs)
    for lo, hi in zip(keys, keys[1:], strict=False):
        if lo <= width <= hi:
            return costs[lo] + (costs[hi] - costs[lo]) * ((width - lo) / (hi - lo))
    raise ValueError(f"no tile cost for width {width}")


def moe_priced_granularity(block_m: int, hot: bool = True) -> int:
    """The granularity the tile choice prices ``block_m``'s partial last tile at (0 for tiles
    of whole width): :data:`MOE_FLEX`, at least :data:`MOE_PRICED_WIDTH_MIN` where a hot
    class may take the hot experts (``hot``)."""
    flex = MOE_FLEX.get(block_m, 0)
    return max(flex, MOE_PRICED_WIDTH_MIN) if flex and hot else flex


def expert_cost(rows: int, block_m: int, flex: int = 0,
                costs: Mapping[int, float] = MOE_TILE_COST) -> float:
    """Cost (``costs`` units, :data:`MOE_TILE_COST` by default) of one expert's ``rows`` in
    ``block_m`` tiles: full tiles, and a partial last tile at its own width when the tile has a
    granularity ``flex`` (:data:`MOE_FLEX`)."""
    full, rest = divmod(rows, block_m)
    cost = full * costs[block_m]
    if rest:
        cost += moe_width_cost(-(-rest // flex) * flex, costs) if flex else costs[block_m]
    return cost


def expected_cost(mean_rows: float, block_m: int, flex: bool = True,
                  costs: Mapping[int, float] = MOE_TILE_COST, hot: bool = True) -> float:
    """``E[expert_cost(X, block_m)]`` for ``X ~ Poisson(mean_rows)`` (the tile's
    :func:`moe_priced_granularity` where ``flex``, ``hot`` passed on; ``costs`` as
    :func:`expert_cost`)."""
    if mean_rows <= 0:
        return 0.0
    granularity = moe_priced_granularity(block_m, hot) if flex else 0
    return sum(p * expert_cost(x, block_m, granularity, costs) for x, p in _poisson(mean_rows))


def moe_block_m(num_slots: float, num_experts: int, flex: bool = True,
                costs: Mapping[int, float] = MOE_TILE_COST, hot: bool = True) -> int:
    """Token tile for ``num_slots`` routed slots (this rank's: :func:`local_slots`) over
    ``num_experts`` local experts: the tile of :data:`MOE_POLICY_TILES` (``flex``; else
    :data:`BLOCK_MS`) with the least :func:`expected_cost` per expert (a larger tile only when
    it is cheaper by :data:`MOE_TILE_MARGIN`; 256 beyond four 256-row tiles per expert, where
    padding no longer matters). 8-token tiles run the streamed kernel (a tile per used expert,
    its weights streamed once), 16-256 WGMMA; ``flex`` (the op's policy) prices the 64-256
    tiles at their flexible width, else at whole tiles; ``hot``: whether a hot class may take
    the hot experts (:func:`moe_priced_granularity`). ``costs``: the tile cost table
    (:data:`MOE_TILE_COST`; tools pass a candidate table to see what it would plan).

    Why not the smallest tile holding the mean: routed counts spread around it, so at a mean of
    8 rows about 40 % of the experts need a second 8-row tile and stream their weights twice;
    one 16-row tile costs only ~1.1 times one 8-row tile (DESIGN.md section 8, "The token
    tile: least expected cost").
    """
    tiles = MOE_POLICY_TILES if flex else BLOCK_MS
    mean = num_slots / max(1, num_experts)
    if mean >= 4 * tiles[-1]:
        return tiles[-1]
    best, best_cost = tiles[0], expected_cost(mean, tiles[0], flex, costs, hot)
    for bm in tiles[1:]:
        cost = expected_cost(mean, bm, flex, costs, hot)
        if cost < best_cost * MOE_TILE_MARGIN:
            best, best_cost = bm, cost
    return best


@functools.cache
def moe_hot_class(block_m: int) -> HotClass | None:
    """The hot class of base tile ``block_m`` (:data:`MOE_HOT_TILE`; None for 8 and 256): an
    expert takes the hot tile when that costs less (:data:`MOE_TILE_COST`) and it has at
    least ``min_rows`` rows: half a hot tile, or more where the base tile is still cheaper
    there. The floor bounds the hot experts (at most ``N / min_rows``), hence the extra padded
    rows they can need (:func:`~nvfp4_ops.kernels.triton.moe_routing.padded_rows`)."""
    hot = MOE_HOT_TILE.get(block_m)
    if hot is None:
        return None
    cost, base_cost = round(100 * MOE_TILE_COST[hot]), round(100 * MOE_TILE_COST[block_m])
    min_rows = hot // 2
    while -(-min_rows // hot) * cost >= -(-min_rows // block_m) * base_cost:
        min_rows += 1
    return HotClass(hot, min_rows, cost, base_cost)


def gemm_supported(n_out: int, k: int) -> bool:
    """Dense shapes a kernel covers (``N_out % 16``, ``K % 128``); others run the reference."""
    return n_out % 16 == 0 and k % 128 == 0


def moe_supported(hidden_size: int, inter: int) -> bool:
    """MoE sizes the grouped GEMMs cover (``H`` and ``I`` multiples of 128)."""
    return hidden_size % 128 == 0 and inter % 128 == 0


def _family(block_m: int, grouped: bool) -> str:
    if block_m <= 8:
        return _STREAM
    if block_m <= 32 and not grouped:
        return _MMA
    return _WGMMA


def _covers(family: str, n_out: int, k: int, block_m: int) -> bool:
    mod = _MODULES[family]
    return block_m in mod.BLOCK_MS and mod.supported(n_out, k)


@functools.cache
def _grouped_covered(n_out: int, k: int, block_m: int) -> bool:
    return _covers(_family(block_m, True), n_out, k, block_m) or _covers(_MMA, n_out, k, block_m)


@functools.cache
def _grouped_permuted(hidden_size: int, inter: int, block_m: int) -> bool:
    """Whether both MoE GEMMs at ``block_m`` run a family with a permuted activation order."""
    family = _family(block_m, True)
    return (family in _PERMUTED_ORDER and _covers(family, inter, hidden_size, block_m)
            and _covers(family, hidden_size, inter, block_m))


@functools.cache
def _moe_tile(block_m: int, hidden_size: int, inter: int) -> int:
    """``block_m``, or the largest smaller tile both grouped GEMMs have a kernel for."""
    while block_m > BLOCK_MS[0] and not (_grouped_covered(inter, hidden_size, block_m)
                                         and _grouped_covered(hidden_size, inter, block_m)):
        block_m = BLOCK_MS[BLOCK_MS.index(block_m) - 1]
    return block_m


@functools.cache
def moe_wperm_supported(hidden_size: int, inter: int) -> bool:
    """Whether the MoE kernels read ``WeightOrder.WPERM`` weights at every token tile the op
    can choose (both GEMMs on a family with a permuted activation order)."""
    if not moe_supported(hidden_size, inter):
        return False
    return all(_grouped_permuted(hidden_size, inter, _moe_tile(bm, hidden_size, inter))
               for bm in BLOCK_MS)


@functools.cache
def moe_mx_supported(hidden_size: int, inter: int) -> bool:
    """Whether the MoE kernels read MXFP4 scales (one UE8M0 byte per 32 k) at every token tile
    for these sizes: both GEMMs on a family with a permuted activation order at every tile
    (as :func:`moe_wperm_supported`), and ``H``, ``I`` multiples of 512 (the streamed tile's
    stages of 512 k or more). V4-Flash and V4-Pro: yes."""
    return (moe_wperm_supported(hidden_size, inter) and hidden_size % 512 == 0
            and inter % 512 == 0)


def _stream_fields(n, k, epilogue, grouped, m_tiles, mx: bool = False,
                   few_rows: bool = False, tiles_cap: int = 0) -> dict:
    """Tile of the streamed decode kernel: 4 consumer warps and 1024-k chunks for dense and
    grouped gate/up problems (persistent CTAs at decode), 2 warps for the other grouped GEMM
    (4 warps and 3 stages at decode, at most :data:`PERSIST_MAX_TILES` token tiles, with
    ``few_rows``; past decode persistent over ``tiles_cap`` token tiles when set); smaller
    chunks when K is not a multiple of the preferred one (with ``mx`` scales, at least 512 k:
    a stage's scale copy is 16 bytes or more)."""
    n_out = n // 2 if epilogue == "swiglu" else n
    if not w4a16_stream.supported(n_out, k):
        raise ValueError(f"unsupported size N_out={n_out}, K={k} (needs N_out%16, K%256)")
    ctas = 0
    decode = m_tiles is not None and m_tiles <= PERSIST_MAX_TILES
    if grouped and epilogue == "swiglu":
        if decode:
            prefs, ctas = [(4, 2, 3)], PERSIST_CTAS
        else:
            prefs = [(4, 2, 2)]
    elif grouped and decode and few_rows:
        prefs = [(4, 2, 3)]  # a few experts' rows fill more SMs (DESIGN.md section 3)
    elif grouped or epilogue == "swiglu":
        prefs = [(2, 2, 2)]
        if grouped and tiles_cap and not decode:
            ctas = n_out // w4a16_stream.SET_ROWS * tiles_cap
    else:
        prefs = [(4, 2, 4)]
    prefs += [(2, 2, 3), (2, 1, 4)]  # 512-k, then 256-k chunks (K is a multiple of 256)
    for warps_k, steps, stages in prefs:
        kc = 128 * warps_k * steps
        if k % kc == 0 and not (mx and kc < 512):
            return dict(warps_k=warps_k, steps=steps, stages=stages, ctas=ctas)
    if mx:
        raise ValueError(f"no streamed tile reads MXFP4 scales at K={k} (needs K % 512 == 0)")
    raise AssertionError("unreachable: K % 256 == 0")


def _mma_fields(n, k, block_m, epilogue) -> dict:
    """Tile of the ``mma.sync`` kernel: at decode tiles one warp column of 16 rows, two row
    groups per warp and K split over up to 8 warps (enough 16-byte weight loads in flight);
    from 64 tokens 4 warps along N and no split. A 2-stage register ring."""
    n_out = n // 2 if epilogue == "swiglu" else n
    if block_m >= 64:
        warps_n, warps_k, row_groups = 4, 1, (1 if epilogue == "swiglu" else 2)
    else:
        warps_n, warps_k, row_groups = 1, 8, 2
        while (k // 128) % warps_k != 0:
            warps_k //= 2
    while row_groups > 1 and n_out % (16 * row_groups * warps_n) != 0:
        row_groups //= 2
    while warps_n > 1 and n_out % (16 * row_groups * warps_n) != 0:
        warps_n //= 2
    return dict(warps_n=warps_n, warps_k=warps_k, row_groups=row_groups)


def _wgmma_fields(n, k, block_m, epilogue, has_bias, grouped, m_tiles) -> dict:
    """Tile of the WGMMA kernel. Grouped 16/32: one row warpgroup and the ring of
    :data:`GROUPED_SMALL_TILES`. Other grouped tiles: :data:`GROUPED_ROW_WGS` row warpgroups
    (two by default) sharing each activation tile; dense tiles below 128 (or without a tile
    count): two; each falling back to two, then one, where N does not divide. Grouped GEMMs
    unroll their k loop by :func:`grouped_unroll`.
    Dense 128/256 with a tile count: the :data:`DENSE_TILES` shape with the least estimated
    time ``ceil(CTAs / NUM_SMS) * blocks per CTA / throughput`` (whole waves of one CTA per SM;
    ties to the first entry)."""
    n_out = n // 2 if epilogue == "swiglu" else n
    per_wg = 32 if epilogue == "swiglu" else 64
    if grouped and (block_m, epilogue) in GROUPED_SMALL_TILES:
        return dict(row_wgs=1, split_k=1, stages=GROUPED_SMALL_TILES[block_m, epilogue],
                    unroll=grouped_unroll(n, k, block_m, 1))
    if not (grouped or m_tiles is None or block_m not in DENSE_TILES):
        m_tiles = max(1, min(m_tiles, DENSE_MAX_M_TILES))
        best, best_time = None, 0.0
        for (row_wgs, split_k), blocks_per_us in DENSE_TILES[block_m].items():
            if n_out % (per_wg * row_wgs) != 0 or k % (w4a16_wgmma.BLOCK_K * split_k) != 0:
                continue
            if row_wgs == 3 and (epilogue != "none" or has_bias):
                continue
            try:  # the config's own checks (ring depth, split-K buffers) decide validity
                w4a16_wgmma.WgmmaConfig(n, k, epilogue, has_bias, grouped, block_m, row_wgs,
                                        split_k)
            except ValueError:
                continue
            ctas = n_out // (per_wg * row_wgs) * m_tiles
            est = -(-ctas // NUM_SMS) * row_wgs / blocks_per_us
            if best is None or est < best_time:
                best, best_time = (row_wgs, split_k), est
        if best is not None:
            return dict(row_wgs=best[0], split_k=best[1], stages=0)
    # the most row warpgroups (of the preferred count, two, one) that divide N
    preferred = grouped_row_wgs(block_m, k) if grouped else 2
    row_wgs = next(r for r in (preferred, 2, 1) if n_out % (per_wg * r) == 0 or r == 1)
    return dict(row_wgs=row_wgs, split_k=1, stages=0,
                unroll=grouped and grouped_unroll(n, k, block_m, row_wgs))


def grouped_unroll(n: int, k: int, block_m: int, row_wgs: int, beside: bool = False) -> bool:
    """Whether a grouped WGMMA tile runs its consumers' k loop unrolled
    (``WgmmaConfig.unroll``): at least :data:`GROUPED_UNROLL_MIN_WEIGHTS` weights per expert
    (``N * K``), or ``beside`` a hot tile (only where the rank holds most of the slots, so the
    expert count need not be known) unless the tile is in :data:`UNROLL_HALVES_OCCUPANCY`."""
    if n * k >= GROUPED_UNROLL_MIN_WEIGHTS:
        return True
    return beside and (block_m, row_wgs) not in UNROLL_HALVES_OCCUPANCY


def grouped_row_wgs(block_m: int, k: int) -> int:
    """The row warpgroups :data:`GROUPED_ROW_WGS` asks of a grouped ``block_m`` tile with
    reduction length ``k`` (before N's divisibility is checked)."""
    row_wgs, min_k = GROUPED_ROW_WGS.get(block_m, (2, 0))
    return row_wgs if k >= min_k else 2


def _streamk_fields(n, k, block_m, epilogue, grouped, m_tiles, family) -> dict | None:
    """The stream-K WGMMA tile (every SM gets the same share of the (output tile, k unit)
    pairs; partial tiles summed in K order by the CTA that completes them) for a dense ``none``
    problem on prepared weights: 16/32 tokens where ``mma.sync`` would run, or 128 tokens in at
    most two tiles where WGMMA would; when each CTA gets >= :data:`STREAMK_MIN_K_TILES` 64-k
    units. 128 k per stage (K % 128 == 0 always holds here: :func:`gemm_supported`), block
    scales a stage ahead at 16-32 tokens, launch overlap."""
    if grouped or epilogue != "none" or m_tiles is None or k % 128 != 0:
        return None
    if not ((family == _MMA and block_m in (16, 32))
            or (family == _WGMMA and block_m == 128 and m_tiles <= 2)):
        return None
    row_wgs, per_sm = STREAMK_TILES[block_m]
    if n % (64 * row_wgs) != 0 or not w4a16_wgmma.supported(n, k):
        return None
    items = n // (64 * row_wgs) * m_tiles
    if items * (k // 64) < STREAMK_MIN_K_TILES * NUM_SMS * per_sm:
        return None
    return dict(row_wgs=row_wgs, split_k=1, stages=STREAMK_STAGES, streamk=per_sm,
                scale_ahead=block_m <= 32, overlap="after")


def _wfrag_small_fields(n, k, block_m, epilogue, has_bias, grouped, family) -> dict | None:
    """The one-warpgroup 6-stage WGMMA tile for a dense 16/32-token ``mma.sync`` problem on
    prepared weights whose 64-row blocks fill two waves (N >= 2 * 64 * SMs; no bias)."""
    if (family != _MMA or grouped or block_m not in (16, 32) or epilogue != "none"
            or has_bias or n < 2 * 64 * NUM_SMS or not w4a16_wgmma.supported(n, k)):
        return None
    return dict(row_wgs=1, split_k=1, stages=6)


def _tma2d(fields: dict, n, k, epilogue, grouped, mx) -> bool:
    """Whether a streamed tile fills its stages with TMA tensor copies
    (``StreamConfig.tma2d``). Grouped: the MoE's gate/up (SwiGLU) GEMM, but not MXFP4's
    persistent decode tile; the down GEMM keeps per-row bulk copies (DESIGN.md section 3,
    "TMA tensor copies"). Dense (non-SwiGLU, one CTA per item): when each CTA streams >=
    :data:`TMA2D_MIN_CHUNKS` K chunks or all CTAs fit one per SM."""
    if grouped:
        return epilogue == "swiglu" and not (mx and fields["ctas"])
    if epilogue != "none" or fields["ctas"] or fields["warps_k"] % 2:
        return False
    chunk = 128 * fields["warps_k"] * fields["steps"]
    return k >= TMA2D_MIN_CHUNKS * chunk or n // w4a16_stream.SET_ROWS <= NUM_SMS


@functools.cache
def plan_gemm(n: int, k: int, block_m: int, *, epilogue: str = "none", has_bias: bool = False,
              grouped: bool = False, m_tiles: int | None = None, permuted: bool = False,
              chained: bool = False, flex: bool = False,
              order: WeightOrder = WeightOrder.CHECKPOINT, mx: bool = False,
              few_rows: bool = False, tiles_cap: int = 0) -> GemmPlan:
    """The plan of one W4A16 GEMM (``N`` weight rows, reduction ``K``, token tile
    ``block_m``).

    Args:
        epilogue: ``none`` (optional bias), ``swiglu`` (gate rows then up rows), ``row_scale``.
        has_bias: (``none``) a bf16 ``[N]`` bias is added.
        grouped: per-tile experts (the MoE); else one weight matrix (linear, MLP).
        m_tiles: token tiles of the launch (dense: ``ceil(M / block_m)`` capped at
            :data:`DENSE_MAX_M_TILES`; grouped: padded rows / ``block_m`` capped one past
            :data:`PERSIST_MAX_TILES`); None when unknown.
        permuted: (grouped) activations in the permuted order of the family serving the tile.
        chained: (grouped) the launch is a GEMM of the MoE chain, so kernels that can overlap
            the previous kernel's tail (launch overlap) do.
        flex: (grouped) tiles of two or more row warpgroups run each CTA only as wide as its
            real rows need (:data:`MOE_FLEX`).
        order: how the weights are stored; WFRAG is for dense problems, WPERM needs
            ``permuted``.
        mx: (grouped, ``permuted``) MXFP4 block scales, one UE8M0 byte per 32 k.
        few_rows: (grouped) the launch expects a few experts' rows at most
            (:data:`FEW_ROWS_SLOTS`): the streamed decode tile of a non-SwiGLU GEMM takes
            more consumer warps.
        tiles_cap: (grouped, not SwiGLU) past decode, the streamed tile runs
            persistent CTAs over at most this many token tiles per feature tile
            (:func:`moe_down_tiles_cap`); 0: one CTA per grid item.

    Raises:
        ValueError: no family covers a grouped problem at ``block_m`` (the routing's padding
            fixes the tile), ``permuted`` where the family has no permuted order, WFRAG with
            ``permuted``, or WPERM weights on a kernel that cannot read them.
    """
    n_out = n // 2 if epilogue == "swiglu" else n
    wfrag = order.fragment_order
    if wfrag and permuted:
        raise ValueError("wfrag weights are read with natural activations, not permuted ones")
    family = _family(block_m, grouped)
    if permuted and not (grouped and family in _PERMUTED_ORDER
                         and _covers(family, n_out, k, block_m)):
        raise ValueError(f"no kernel reads k-permuted activations for N={n}, K={k}, "
                         f"block_m={block_m}, grouped={grouped}")
    if mx and not (grouped and permuted):
        raise ValueError("MXFP4 scales (mx) are read by the grouped kernels with permuted "
                         "activations only")
    if not _covers(family, n_out, k, block_m):
        family = _MMA
        if block_m not in w4a16_gemm.BLOCK_MS:
            if grouped:
                raise ValueError(f"no kernel covers grouped N_out={n_out}, K={k} at "
                                 f"block_m={block_m}")
            block_m = max(w4a16_gemm.BLOCK_MS)
    flags: dict = {}
    fields = None
    if wfrag:
        fields = _streamk_fields(n, k, block_m, epilogue, grouped, m_tiles, family)
        if fields is None:
            fields = _wfrag_small_fields(n, k, block_m, epilogue, has_bias, grouped, family)
        if fields is not None:
            family = _WGMMA
    if fields is None:
        if family == _STREAM:
            fields = _stream_fields(n, k, epilogue, grouped, m_tiles if grouped else None, mx,
                                    few_rows, tiles_cap)
            if grouped:
                flags["overlap"] = "after" if chained else "none"
            if grouped or wfrag:
                flags["tma2d"] = _tma2d(fields, n, k, epilogue, grouped, mx)
        elif family == _MMA:
            fields = _mma_fields(n, k, block_m, epilogue)
        else:
            fields = _wgmma_fields(n, k, block_m, epilogue, has_bias, grouped,
                                   None if permuted else m_tiles)
            if grouped and permuted:
                flags["overlap"] = "after" if chained else "none"
            if grouped and flex and fields["row_wgs"] >= 2 and block_m in MOE_FLEX:
                flags["flex"] = MOE_FLEX[block_m]
    if permuted:
        flags["act_order"] = _PERMUTED_ORDER[family]
    if mx:
        flags["mx"] = True
    # the wperm bits are read with the fragment order (dense) or the permuted activations
    # (the MoE); no op passes dense weights in the wperm order alone
    if order.wperm_bits and not (wfrag or permuted):
        raise ValueError(f"no kernel reads wperm weights for N={n}, K={k}, "
                         f"block_m={block_m}, grouped={grouped}, permuted={permuted}")
    config = _CONFIGS[family](n, k, epilogue, has_bias, grouped, block_m, **fields, **flags,
                              order=order)
    return GemmPlan(family, config)


def plan_of_config(config) -> GemmPlan:
    """The plan that launches exactly ``config`` (its family from its class): for tools and
    tests that run a config the policy would not pick. Chooses nothing."""
    return GemmPlan(next(f for f, cls in _CONFIGS.items() if isinstance(config, cls)), config)


def _dense_m_tiles(num_rows: int, block_m: int) -> int:
    return min(-(-num_rows // block_m), DENSE_MAX_M_TILES)


def _grouped_m_tiles(num_rows: int, block_m: int) -> int:
    return min(num_rows // block_m, PERSIST_MAX_TILES + 1)


# per eager call: a lookup instead of the policy (~1.5 µs of host time); bounded, since
# prefill batches come in many sizes
@functools.lru_cache(maxsize=8192)
def plan_linear(n: int, k: int, num_tokens: int, *, has_bias: bool = False,
                order: WeightOrder = WeightOrder.CHECKPOINT) -> GemmPlan | None:
    """The plan of ``nvfp4::linear`` on CUDA for ``num_tokens >= 1`` rows of ``[N, K]``
    weights; None where no kernel covers the shape (the op then runs the exact reference)."""
    if not gemm_supported(n, k):
        return None
    bm = dense_block_m(num_tokens)
    return plan_gemm(n, k, bm, has_bias=has_bias, m_tiles=_dense_m_tiles(num_tokens, bm),
                     order=order)


@functools.lru_cache(maxsize=8192)
def plan_mlp(hidden_size: int, inter: int, num_tokens: int, *,
             order: WeightOrder = WeightOrder.CHECKPOINT) -> tuple[GemmPlan, GemmPlan] | None:
    """``(gate/up with SwiGLU, down)`` plans of ``nvfp4::mlp`` for ``num_tokens >= 1`` rows;
    None where no kernel covers the sizes."""
    if not (gemm_supported(inter, hidden_size) and gemm_supported(hidden_size, inter)
            and inter % 16 == 0):
        return None
    bm = dense_block_m(num_tokens)
    m_tiles = _dense_m_tiles(num_tokens, bm)
    return (plan_gemm(2 * inter, hidden_size, bm, epilogue="swiglu", m_tiles=m_tiles,
                      order=order),
            plan_gemm(hidden_size, inter, bm, m_tiles=m_tiles, order=order))


@functools.cache
def plan_moe(num_tokens: int, top_k: int, num_experts: int, hidden_size: int, inter: int, *,
             global_num_experts: int = -1, order: WeightOrder = WeightOrder.CHECKPOINT,
             block_m: int | None = None, permuted: bool | None = None,
             chained: bool = True, hot: bool = True, flex: bool = True,
             mx: bool = False) -> MoEPlan | None:
    """The plan of ``nvfp4::moe`` on CUDA for ``num_tokens >= 1`` tokens routed top-``k`` over
    ``num_experts`` local experts of ``global_num_experts`` (-1: unknown, taken as all local);
    None where the grouped GEMMs do not cover ``(H, I)``.

    Under expert parallelism the tile is chosen for the rank's expected share of the slots
    (:func:`local_slots`): one rank of EP 8 sees about 1/8 of them, and a tile sized for all
    ``T * k`` would be mostly padding rows.

    Experts with many rows may take a larger hot tile (:func:`moe_hot_class`), decided on the
    device from their real counts: wherever the base tile has one, its kernels read the same
    activation order, ``N`` slots leave room for at least one hot expert and the rank holds
    at least half of the global experts.

    ``block_m`` / ``permuted`` override the policy's token tile / activation order (tests and
    tools). The 64-256-row tiles run each CTA only as wide as its real rows need (``flex``,
    :data:`MOE_FLEX`), and the tile is chosen with that priced in (:func:`moe_block_m`; no
    narrower than :data:`MOE_PRICED_WIDTH_MIN` where a hot class may run).

    ``chained=False`` launches the GEMMs without launch overlap, ``hot=False`` keeps one
    tile for all experts and ``flex=False`` runs whole tiles (tests and tools only; the op
    never passes them). ``mx``: MXFP4 block scales (one UE8M0 byte per 32 k).

    Raises:
        ValueError: ``order`` is WPERM but the kernels at this tile cannot read it
            (:func:`moe_wperm_supported`), or WFRAG (a dense order); ``mx`` at sizes whose
            kernels cannot read it (:func:`moe_mx_supported`).
    """
    if not moe_supported(hidden_size, inter):
        return None
    if order is WeightOrder.WFRAG:
        raise ValueError("the MoE kernels read checkpoint or wperm weights, not wfrag")
    if mx and not moe_mx_supported(hidden_size, inter):
        raise ValueError(f"no MoE kernels read MXFP4 scales at H={hidden_size}, I={inter} "
                         "(dispatch.moe_mx_supported)")
    num_slots = num_tokens * top_k
    slots = local_slots(num_slots, num_experts, global_num_experts)
    # a hot class only where this rank can expect most of the slots (no expert parallelism,
    # or 2 ranks): the hot grid and rows are sized for all N slots, which under EP 8 is 8x
    # the rank's share, and their empty CTAs cost more than hot tiles gain (DESIGN.md
    # section 8, "Hot experts")
    most_slots = 2 * slots >= num_slots
    if block_m is None:
        block_m = _moe_tile(moe_block_m(slots, num_experts, flex, hot=most_slots),
                            hidden_size, inter)
    if permuted is None:
        permuted = _grouped_permuted(hidden_size, inter, block_m)
    hot_class = _hot_class(block_m, hidden_size, inter, permuted) if hot else None
    if hot_class is not None and not (
            most_slots and hot_experts_bound(num_slots, num_experts, hot_class) > 0):
        hot_class = None
    num_rows = padded_rows(num_slots, num_experts, block_m, hot_class)

    def gemms(tile: int, sibling: bool = False) -> tuple[GemmPlan, GemmPlan]:
        common = dict(grouped=True, m_tiles=_grouped_m_tiles(num_rows, tile),
                      permuted=permuted, chained=chained, flex=flex, order=order, mx=mx)
        gate_up = plan_gemm(2 * inter, hidden_size, tile, epilogue="swiglu", **common)
        down = plan_gemm(hidden_size, inter, tile, epilogue="row_scale",
                         few_rows=slots <= FEW_ROWS_SLOTS,
                         tiles_cap=moe_down_tiles_cap(num_rows, tile, slots, num_slots),
                         **common)
        assert (down.block_m, down.act_order) == (gate_up.block_m, gate_up.act_order)
        if sibling and chained:  # the base GEMMs run beside the hot ones (moe_cuda)
            gate_up, down = _sibling(gate_up), _sibling(down)
        return gate_up, down

    gate_up, down = gemms(block_m, sibling=hot_class is not None)
    hot_plan = None
    if hot_class is not None:
        hot_plan = HotPlan(hot_class, *gemms(hot_class.block_m))
        assert hot_plan.gate_up.act_order == gate_up.act_order
    return MoEPlan(num_rows, gate_up, down, hot_plan, chained)


def _hot_class(block_m: int, hidden_size: int, inter: int, permuted: bool) -> HotClass | None:
    """The hot class a MoE at ``(H, I)`` can add to base tile ``block_m``, whatever ``T``: the
    tile's :func:`moe_hot_class` where both GEMMs have a kernel at the hot tile that reads the
    base tile's (permuted) activation order."""
    hot = moe_hot_class(block_m) if permuted else None
    if hot is None or not (_moe_tile(hot.block_m, hidden_size, inter) == hot.block_m
                           and _grouped_permuted(hidden_size, inter, hot.block_m)):
        return None
    return hot


def _sibling(plan: GemmPlan) -> GemmPlan:
    """``plan`` launched beside the previous kernel (``overlap='beside'``): a base tile
    beside a hot one, its k loop form by :func:`grouped_unroll` with ``beside``."""
    cfg = plan.config
    fields = dict(overlap="beside")
    if plan.family == "wgmma":
        fields["unroll"] = grouped_unroll(cfg.n, cfg.k, cfg.block_m, cfg.row_wgs, beside=True)
    return dataclasses.replace(plan, config=dataclasses.replace(cfg, **fields))


# ---------------------------------------------------------------------------- reachability


def _dense_reach(block_m: int) -> tuple[int, ...]:
    """The ``m_tiles`` a dense call with tile ``block_m`` can reach."""
    return tuple(sorted({_dense_m_tiles(m, block_m)
                         for m in range(1, block_m * DENSE_MAX_M_TILES + 1)
                         if dense_block_m(m) == block_m}))


def reachable_plans(*, linears=(), mlps=(), moes=()) -> list[GemmPlan]:
    """Every GEMM plan the given layers can launch, at any token count (what warm-up compiles
    and runs). ``linears``: ``(N, K, has_bias, order)``; ``mlps``: ``(H, I, order)``;
    ``moes``: ``(H, I, order, mx)`` (any expert count: the grouped configs do not depend on
    it; ``mx``: MXFP4 scales, :func:`moe_mx_supported` sizes only).
    Unique by compile key (``config.name``), in a stable order."""
    seen: dict[str, GemmPlan] = {}

    def add(plan: GemmPlan) -> None:
        seen.setdefault(plan.config.name, plan)

    dense_bms = tuple(dict.fromkeys(dense_block_m(m) for m in range(1, 512)))
    for n, k, has_bias, order in linears:
        if not gemm_supported(n, k):
            continue
        for bm in dense_bms:
            for m_tiles in _dense_reach(bm):
                add(plan_gemm(n, k, bm, has_bias=has_bias, m_tiles=m_tiles, order=order))
    for hidden_size, inter, order in mlps:
        if plan_mlp(hidden_size, inter, 1, order=order) is None:
            continue
        for bm in dense_bms:
            for m_tiles in _dense_reach(bm):
                add(plan_gemm(2 * inter, hidden_size, bm, epilogue="swiglu", m_tiles=m_tiles,
                              order=order))
                add(plan_gemm(hidden_size, inter, bm, m_tiles=m_tiles, order=order))
    for hidden_size, inter, order, mx in moes:
        if not (moe_mx_supported(hidden_size, inter) if mx else moe_supported(hidden_size,
                                                                               inter)):
            continue
        for bm in MOE_POLICY_TILES:
            tile = _moe_tile(bm, hidden_size, inter)
            permuted = _grouped_permuted(hidden_size, inter, tile)
            for m_tiles in range(1, PERSIST_MAX_TILES + 2):
                common = dict(grouped=True, m_tiles=m_tiles, permuted=permuted, chained=True,
                              flex=True, order=order, mx=mx)
                for plan in (plan_gemm(2 * inter, hidden_size, tile, epilogue="swiglu",
                                       **common),
                             *(plan_gemm(hidden_size, inter, tile, epilogue="row_scale",
                                         few_rows=few, tiles_cap=cap, **common)
                               for few in (False, True) for cap in (0, DOWN_TILES_CAP))):
                    add(plan)
                    if _hot_class(tile, hidden_size, inter, permuted) is not None:
                        add(_sibling(plan))  # the base tile beside a hot one
    return list(seen.values())


def moe_act_orders(hidden_size: int, inter: int) -> list[tuple[int, str]]:
    """``(block_m, act_order)`` of every MoE plan the sizes can reach (the Triton gather's
    variants; any T, any expert count)."""
    if not moe_supported(hidden_size, inter):
        return []
    out = []
    for bm in MOE_POLICY_TILES:
        tile = _moe_tile(bm, hidden_size, inter)
        permuted = _grouped_permuted(hidden_size, inter, tile)
        order = _PERMUTED_ORDER[_family(tile, True)] if permuted else NATURAL
        out.append((tile, order))
    return list(dict.fromkeys(out))
