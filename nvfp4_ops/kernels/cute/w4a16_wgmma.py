"""Exact W4A16 NVFP4 grouped GEMM for Hopper (sm_90a) on WGMMA, written in CuTeDSL.

Same contract and math as :mod:`nvfp4_ops.kernels.cute.w4a16_gemm` (read its docstring): for
every token row ``p`` of a token tile whose group (expert) is ``g``,
``out[p, n] = epilogue(sum_k a[p, k] * e2m1[g, n, k] * block_scale[g, n, k//16] * global[g, n])``
with the arguments ``a`` bf16 ``[P, K]``, ``w`` u8 ``[G, N, K/2]``, ``w_scale`` u8 (e4m3 bytes)
``[G, N, K/16]``, ``w_global`` f32 ``[G, H2, N/H2]`` (any strides; ``global[g, n]`` =
``w_global[g, n // (N/H2), n % (N/H2)]``, ``H2`` = 2 for ``swiglu`` else 1:
:mod:`nvfp4_ops.kernels.cute.gemm_interface`), ``out`` bf16 ``[P, N_out]``, ``tile_expert`` i32
``[ceil(P / block_m)]`` (-1 = skip the tile; a dummy when not grouped), ``row_scale`` f32
``[P]``, ``bias`` bf16 ``[N]``, ``counters`` i32 / ``scratch`` f32 (stream-K's workspace, below),
``swiglu_limit`` f32, in that order. ``P`` and ``G`` are symbolic.
It serves prefill and mid batches (dense tiles of 64-256 tokens, grouped 16-256) and, on
prepared (``wfrag``) weights, the stream-K tiles of large dense layers at 16-128 tokens.

Roles (``wgmma.mma_async``, "RS" form)
--------------------------------------
* Operand A (64 rows x 16 k per instruction, from **registers**): the weights. Each consumer
  warpgroup owns 64 "A rows". Warp ``w`` of the warpgroup holds A rows ``16w .. 16w+15``; inside
  the warp it is the ``mma.sync.m16n8k16`` A layout: lane ``4g + c`` holds 4 bf16x2 registers
  (A row g, k 2c..2c+1), (row g+8, k 2c..), (row g, k 2c+8..), (row g+8, k 2c+8..).
* Operand B (``block_m`` tokens x 16 k, from **shared memory**): the activations, TMA-loaded as
  ``[block_m, 64]`` bf16 tiles (K-major, 128-byte swizzle) in natural k order. TMA zero-fills
  token rows ``>= P``; the epilogue never stores them.
* Accumulators: fp32 ``[64 A rows, block_m tokens]`` per warpgroup in registers.

Weights: no re-layout. The producer warp TMA-copies 32-row x 32-byte boxes of the checkpoint
bytes (64 k per row per stage) into shared memory, row-major, unswizzled (two 16-byte reads of
one quad phase hit rows 64 bytes apart: different banks). A lane reads its row's 16 bytes of
a 32-k chunk (a quad-broadcast ``ld.shared.v4``: words ``w0..w3``, byte ``b`` of the chunk
holds the codes of k ``2b, 2b+1``) and needs bytes ``c`` (k 2c, 2c+1 of step 0), ``4+c``
(k 2c+8.. of step 0), ``8+c`` and ``12+c`` (step 1): byte ``c`` of each word. Three ``prmt``
gather them into one u32 in that order, and the ``shift`` decoder of ``w4a16_gemm`` turns it
into the 4 bf16x2 registers of the two k16 steps (``e2m1 * 2^-126`` by bit moves, times
``block_scale * 2^119``: exactly ``e2m1 * block_scale * 2^-7``; the epilogue multiplies the fp32
accumulator by 2^7). The block scales (1 byte per row per 16 k, 4 bytes per row per stage) are
read by the consumers with plain ``ld.global.nc`` one stage ahead (a TMA box needs >= 16 bytes).

k-permuted activations (``kperm``, the MoE): when ``a`` holds each 32-block of k in the order
of :mod:`nvfp4_ops.orders.kperm`, lane ``c`` of a quad reads only its own 4 bytes of a row's
32-k chunk (physical k ``8c .. 8c+7``, one block scale) with one ``ld.shared.b32`` and decodes
them with the ``pair4`` decoder of :mod:`nvfp4_ops.kernels.cute.fp4_ptx`, whose outputs
``(8c + j, 8c + j + 4)`` are exactly the logical pairs the permuted B holds in the fragment
slots above; a SwiGLU output is then stored in the same permuted order (it is GEMM 2's ``a``).
Fewer integer instructions per weight is what the decode-bound tiles need.

Fragment-order weights (``wfrag``, dense): the weights were reordered once at load time
(:mod:`nvfp4_ops.orders.wfrag`) so that each lane's u32 word per row and 32 k already holds
its fragment's codes; it decodes them with ``pair4`` and the block's two scales against natural
activations, with no byte gathering. The four lanes of a quad share their rows' scales: each
converts one pair and the others take it by ``shfl.sync``.

Row mapping. ``none`` / ``row_scale``: A row ``a`` of row warpgroup ``q`` is weight row
``r0 + 64q + a`` (``r0 = 64 * row_wgs * blockIdx.x``). ``swiglu``: A row ``16w + i`` is gate
row ``f0 + 32q + 8w + i`` for ``i < 8`` and up row ``f0 + 32q + 8w + (i - 8) + N/2`` for
``i >= 8`` (``f0 = 32 * row_wgs * blockIdx.x``): the C fragment puts A rows ``g`` and ``g+8`` in
the same thread, so gate and up of one output feature meet in one thread's registers.

Pipeline: the last warpgroup is the producer (one warp issues TMA; registers handed to the
consumers with ``setmaxnreg``), warpgroups ``0 .. row_wgs * split_k - 1`` decode and multiply.
Stages of 64 k (``[block_m, 64]`` bf16 + ``row_wgs * 64`` weight rows x 32 bytes) cycle
through a full/empty mbarrier ring. Per 32-k chunk a consumer decodes into one of two
A-fragment buffers, issues two k16 WGMMAs and commits; it then loads the next chunk's weight
words and block scales from shared memory and only then waits until just this chunk's WGMMAs
are in flight (the other A buffer is free again): the decode of the next chunk overlaps the
tensor-core work of this one, the load latency hides behind the wait. A stage is released once
the WGMMAs that read it have retired (one chunk later). ``split_k`` warpgroups on the same rows
take turns on the k tiles and are summed through shared memory in slice order (deterministic;
only the tiles of :data:`VERIFIED_MULTI` are accepted).

Stream-K (``streamk``: dense ``none`` on ``wfrag`` weights, no split-K, 128-k stages):
``streamk`` CTAs per SM (the grid is read off the scratch's length) each take an even share of
the (output tile, 128-k stage) units and run them through the same ring and
:meth:`W4A16WgmmaGemm.tile` loop, tile after tile; partial tiles are summed in K order by the
CTA that completes them (:mod:`nvfp4_ops.kernels.cute.streamk`): deterministic, and no CTA waits
for another. Thread 0 publishes a parked piece and acquires the others' with one
acquire-release atomic between two CTA barriers. The tile counters and the fp32 scratch (the
launcher's stream-K workspace, ``linear_cuda.StreamKWorkspace``) are the interface's
``counters`` and ``scratch`` operands (one-element dummies for every other config). The kernel
leaves the counters at zero, so the launcher reuses one buffer per stream or graph capture. With
``pdl`` (every stream-K tile) the producer streams its first item's first stages of weights and
scales before ``griddepcontrol.wait``, and their activations after it; the consumers wait first
thing, then let the next kernel launch (the protocol of ``moe_cuda``'s "Launch overlap"). The
counters, the scratch, the output and the activations are touched only after the wait.

Wide stages (``stage_k=128``, the stream-K tiles). A stage holds 128 k: one TMA box of
``64 * row_wgs`` weight rows x 64 bytes (64-byte swizzle: 16-byte unit ``u`` of row ``r`` at
``u ^ ((r >> 1) & 3)``, so the 8 rows of a quad-load phase hit distinct banks), two
``[block_m, 64]`` activation boxes, and the block scales: a ``(rows, 16 bytes)`` box of the
``[N, K/16]`` scale matrix at column ``16 * (kt // 2)``, which holds this stage's 8 bytes per
row and its pair's (a TMA box row is at least 16 bytes). The consumers run
:meth:`W4A16WgmmaGemm.tile` twice per stage; after the stage's wait each lane reads 4 scale bytes
with one ``ld.shared`` (its row, one 64-k tile, both chunks) and converts them. Why: at 16
tokens a 64-k ring (32 bytes per weight row per stage) was itself the floor of the tile.
With ``scale_ahead`` (16-32 tokens) the producer warp copies the scales with ``cp.async``
instead, 8 bytes per row, and each slot also holds the next stage's: the consumers load and
convert those during chunk 0's WGMMAs, so a stage starts with its scales in registers.

Registers and occupancy: with several consumer warpgroups and ``block_m >= 128``
(:attr:`WgmmaConfig.uses_setmaxnreg`) the producer hands registers to the consumers with
``setmaxnreg`` inside the CTA's launch allocation (168 per lane at 384 threads: 40 / 232; 96
at 640 threads: 24 / 112), one CTA per SM. Smaller tiles need 50-79 registers and no
``setmaxnreg``, so 2-3 CTAs share an SM, which the decode latency of small grouped tiles needs.

MXFP4 scales (``mx``, grouped ``kperm``: the MoE on DeepSeek's own checkpoints): ``w_scale`` holds
one UE8M0 byte per 32 k, so a lane loads 2 bytes per row per 64-k tile instead of 4, and a
32-k chunk, one MX block, needs no exchange inside the quad: each lane turns its rows' byte
``j`` into the (lo, hi) bf16x2 pair with a ``prmt`` and a ``mad``
(:func:`~nvfp4_ops.kernels.cute.fp4_ptx.mx_pair_pre`) where e4m3 took a conversion chain and a
shuffle. The decode and the MMAs are those of ``kperm``.

Flexible width (``flex``, grouped): a MoE token tile holds one expert's rows, often fewer
than ``block_m``. The CTA reads ``tile_rows[tile]`` and runs its whole tile at the width
``flex * ceil(rows / flex)``: a code path per width (:attr:`WgmmaConfig.widths`), each with
its own ring barriers (a stage delivers ``width`` activation rows as ``width / flex`` TMA boxes
of ``flex`` rows), its ring layout (stage stride ``width`` rows) and a WGMMA of N = ``width``,
so padding rows cost neither tensor-core time nor activation traffic. Rows past the width are
neither read nor written (their outputs are never combined). Every output element sums the
same products in the same order at any width.

Unrolled k loop (``unroll``; no split-K or stream-K): k tile ``t`` always reads ring slot
``t % stages`` at phase ``(t // stages) & 1``, and K is a compile-time size, so the consumers
run their middle tiles in rounds of ``stages`` tiles starting at tile 1 (a runtime loop whose
body is ``stages`` traced tiles, each with its slot as a constant) and the tiles past the last
whole round traced one by one. The slot's shared-memory addresses, its WGMMA descriptors and
its barriers become constants where the rolled loop computes them and the ring state's
wrap-around every tile. The order of every product and sum is that of the rolled loop.

Grid: ``(N_out / features_per_cta, ceil(P / block_m))``, from static sizes and ``P`` only; the
tile shape for a problem is chosen by :mod:`nvfp4_ops.kernels.dispatch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from nvfp4_ops.kernels.cute.fp4_ptx import (
    bf16x2_halves,
    decode_word_pair4,
    decode_word_pair4_2s,
    decode_word_wperm,
    decode_word_wperm_2s,
    gather_decode,
    ld_shared_v4_at,
    ld_u16,
    mx_pair_pre,
    scale_pair_pre,
)
from nvfp4_ops.kernels.cute.gemm_interface import (
    EPILOGUES,
    LAUNCH_OVERLAPS,
    GemmProblem,
    clamped_swiglu,
    compile_from_fakes,
    row_global,
)
from nvfp4_ops.kernels.cute.ptx import (
    ldg_u32,
    lds_u32_at,
    prmt,
    shfl_quad,
    shfl_quad_from,
)
from nvfp4_ops.kernels.cute.streamk import StreamKTiles
from nvfp4_ops.orders import WeightOrder
from nvfp4_ops.orders.kperm import KPERM, NATURAL

__all__ = [
    "BLOCK_K",
    "BLOCK_MS",
    "EPILOGUES",
    "VERIFIED_GROUPED",
    "VERIFIED_MULTI",
    "W4A16WgmmaGemm",
    "WgmmaConfig",
    "compile_gemm",
    "supported",
]

#: token tiles (WGMMA N) a binary can be compiled for: 64-256 for prefill, 16/32 for MoE experts
#: with few rows each (the tile still streams the expert's weights once).
BLOCK_MS = (16, 32, 64, 128, 256)
#: k per pipeline stage: one 128-byte swizzle atom of bf16 activations.
BLOCK_K = 64
#: usable dynamic shared memory per CTA on H100/H200 (227 KiB), minus barriers and slack.
SMEM_BUDGET = 227 * 1024 - 1024
#: dense ``(block_m, row_wgs, split_k)`` tiles with split-K or more than two consumer
#: warpgroups that ran exact on an H200 (``nvfp4_ops/kernels/DESIGN.md``, "WGMMA tiles");
#: other such tiles are refused: a wrong register split there can hang the GPU. The dispatch
#: picks from ``dispatch.DENSE_TILES``; ``(128, 1, 4)`` and ``(64, 1, 2)`` stay valid for the
#: tile tools (``benchmarks/dev/profile_gemm.py wgmma``) and the tests that compile them.
VERIFIED_MULTI = frozenset({(128, 1, 2), (128, 1, 4), (128, 2, 2), (128, 4, 1), (256, 1, 2),
                            (64, 1, 2), (128, 3, 1)})
#: grouped (MoE) ``(block_m, row_wgs, split_k)`` tiles of more than two consumer warpgroups
#: that ran exact on an H200 (bitwise the two-warpgroup tile's outputs)
VERIFIED_GROUPED = frozenset({(64, 4, 1), (128, 4, 1)})


@dataclass(frozen=True)
class WgmmaConfig(GemmProblem):
    """Everything that changes the generated code (P and G are symbolic).

    The problem fields of :class:`GemmProblem` (``block_m``: tokens per CTA = the WGMMA N),
    then ``row_wgs``: consumer warpgroups on different 64-A-row blocks (they share
    the activation tile). ``split_k``: consumer warpgroups on the same rows that take turns on
    the k tiles (deterministic reduction through shared memory at the end); there are
    ``row_wgs * split_k`` consumer warpgroups. ``stages``: depth of the TMA ring (0 = as many
    as fit in shared memory, at most 8).
    """

    PREFIX: ClassVar[str] = "w4a16wg"
    BLOCK_MS: ClassVar[tuple[int, ...]] = BLOCK_MS
    PERMUTED_ORDER: ClassVar[str] = KPERM

    block_m: int = 128
    row_wgs: int = 2
    split_k: int = 1
    stages: int = 0
    #: the activations' k order (operand B): ``natural``, or ``kperm`` (:mod:`nvfp4_ops.orders.
    #: kperm`; a SwiGLU output is written in that order too, the MoE's GEMM 1 feeding GEMM 2):
    #: each lane then decodes its own 4 checkpoint bytes per row and 32 k with the ``pair4``
    #: decoder (one 4-byte shared load and one block scale) instead of gathering bytes from 16
    act_order: str = NATURAL
    #: launch overlap (:data:`~nvfp4_ops.kernels.cute.gemm_interface.LAUNCH_OVERLAPS`):
    #: ``after`` (grouped: the MoE chain; dense stream-K tiles): programmatic dependent launch,
    #: the producer streams the first stages' weights before ``griddepcontrol.wait``,
    #: activations only after it; the consumers wait before they touch anything else, then let
    #: the next kernel launch (the ordering argument is in ``moe_cuda``'s docstring, "Launch
    #: overlap"). ``beside`` (grouped): the launch runs beside the previous kernel instead of
    #: after it: what it reads was complete when the previous kernel let it launch, and it
    #: writes rows the previous kernel does not touch (the MoE's base-tile GEMM after its
    #: hot-tile GEMM, ``moe_cuda``, "Two token tiles"). So no thread waits before working;
    #: CTA 0 waits at its end, so the grid still completes only after the previous one
    overlap: str = "none"
    #: how the weight codes are stored: CHECKPOINT; WPERM (the ``wperm`` bit order of
    #: :mod:`nvfp4_ops.orders.wperm`, ``kperm`` tiles only: the ``pair4`` path); or WFRAG (the
    #: fragment order of :mod:`nvfp4_ops.orders.wfrag` with those bits, natural activations:
    #: each lane decodes its own u32 word per row and 32 k with ``pair4`` and the block's two
    #: scales, no byte gathering, no permuted activations)
    order: WeightOrder = WeightOrder.CHECKPOINT
    #: stream-K (dense ``none`` ``wfrag`` problems, ``split_k = 1``, 128-k stages): ``streamk``
    #: CTAs per SM split the (output tile, stage) units evenly
    #: (:mod:`nvfp4_ops.kernels.cute.streamk`; 0 = one CTA per output tile)
    streamk: int = 0
    #: 128-k stages: the producer warp copies the block scales with ``cp.async`` (8 bytes per
    #: row, all 32 lanes, completing on the stage's full barrier through
    #: ``cp.async.mbarrier.arrive``) instead of a TMA box, and each stage's slot holds the
    #: *next* stage's scales as well (its row's second 8 bytes; the first 8 only at a stream-K
    #: piece's first stage): the consumers load and convert them during a stage, so the next
    #: stage starts with its scales in registers
    scale_ahead: bool = False
    #: (grouped) token width granularity: each CTA runs its tile only as wide as its real
    #: rows need, ``flex * ceil(tile_rows / flex)`` tokens ("Flexible width" in the module
    #: docstring; 0 = always ``block_m``)
    flex: int = 0
    #: MXFP4 block scales: ``w_scale`` holds one UE8M0 byte per 32 k (``[G, N, K/32]``, bytes
    #: in ``format.MXFP4_KERNEL_SCALE_BYTES``) instead of one e4m3 per 16 ("MXFP4 scales" in
    #: the module docstring); grouped ``kperm`` tiles only
    mx: bool = False
    #: the consumers' k loop unrolled by the ring depth (``split_k = 1``, 64-k stages, no
    #: stream-K): every 64-k tile of an unrolled iteration reads a fixed ring slot, so the
    #: ring state's wrap-around and the slot's address and descriptor arithmetic become
    #: constants ("Unrolled k loop" in the module docstring)
    unroll: bool = False
    arch: str = "sm_90a"

    def __post_init__(self) -> None:
        self.check_problem()
        if self.row_wgs not in (1, 2, 3, 4) or self.split_k not in (1, 2, 4):
            raise ValueError("row_wgs must be 1, 2, 3 or 4 and split_k 1, 2 or 4")
        if self.row_wgs == 3 and (self.grouped or self.split_k > 1 or self.block_m > 128):
            # 512 threads leave 128 registers per lane at launch: a 256-token tile's
            # accumulators do not fit (ptxas C7602)
            raise ValueError("row_wgs=3 is for dense problems without split_k, block_m <= 128")
        if self.consumers > 4:
            raise ValueError(f"at most 4 consumer warpgroups, got {self.consumers}")
        verified = VERIFIED_GROUPED if self.grouped else VERIFIED_MULTI
        if ((self.split_k > 1 or self.consumers > 2)
                and (self.block_m, self.row_wgs, self.split_k) not in verified):
            raise ValueError("this split_k > 1 / more than 2 consumer warpgroups tile is not "
                             "validated on a GPU (w4a16_wgmma.VERIFIED_MULTI, VERIFIED_GROUPED)")
        if self.order is WeightOrder.WPERM and not self.permuted:
            raise ValueError("the WPERM order needs kperm (only the pair4 decode paths read it)")
        if self.order.fragment_order and self.permuted:
            raise ValueError("wfrag (fragment-order weights, natural activations) excludes "
                             "kperm (permuted activations)")
        if self.k % (BLOCK_K * self.split_k) != 0:
            raise ValueError(f"K={self.k} must be a multiple of {BLOCK_K * self.split_k}")
        if self.epilogue == "swiglu" and self.n % 64 != 0:
            raise ValueError("swiglu needs N % 64 == 0")
        if self.n_out % self.features_per_cta != 0:
            raise ValueError(f"N_out={self.n_out} must be a multiple of {self.features_per_cta}")
        if self.num_stages < 2:
            raise ValueError(f"{self.name}: fewer than 2 pipeline stages fit in shared memory")
        if self.overlap not in LAUNCH_OVERLAPS:
            raise ValueError(f"overlap must be one of {LAUNCH_OVERLAPS}, got {self.overlap!r}")
        if self.pdl and not (self.grouped or self.streamk):
            raise ValueError("launch overlap is for grouped problems and stream-K tiles")
        if self.sibling and not (self.grouped and not self.streamk):
            raise ValueError("overlap='beside' is for grouped problems")
        if self.k < 2 * BLOCK_K * self.split_k:
            raise ValueError(f"K={self.k} too small: each k slice needs >= 2 tiles of {BLOCK_K}")
        if self.split_k > 1 and 2 * (self.split_k - 1) * self.row_wgs > self.num_stages:
            raise ValueError(f"{self.name}: split-K partials do not fit in the ring buffers")
        if self.streamk < 0:
            raise ValueError(f"streamk must be >= 0, got {self.streamk}")
        if self.streamk and (self.grouped or self.epilogue != "none" or self.split_k > 1
                             or self.permuted or not self.order.fragment_order or self.k % 128):
            raise ValueError("streamk is for dense 'none' problems (bias allowed) on wfrag "
                             "weights with split_k=1 and K % 128 == 0")
        if self.scale_ahead and self.stage_k != 128:
            raise ValueError("scale_ahead is for 128-k stages")
        if self.flex and not (self.grouped and not self.streamk and self.split_k == 1
                              and self.flex in (16, 32, 64) and self.block_m % self.flex == 0
                              and self.block_m // self.flex <= 4):
            raise ValueError(f"flex={self.flex}: a width granularity is for grouped tiles "
                             "without split_k, 16, 32 or 64 dividing block_m in at most 4 widths")
        if self.mx and not (self.grouped and self.permuted and not self.streamk):
            raise ValueError("mx (UE8M0 scales per 32 k) is for grouped kperm tiles")
        if self.unroll and (self.split_k > 1 or self.streamk):
            raise ValueError("unroll (the k loop by the ring depth) is for tiles without "
                             "split_k or stream-K")

    @property
    def consumers(self) -> int:
        return self.row_wgs * self.split_k

    @property
    def stage_k(self) -> int:
        """k per pipeline stage: 64, or 128 for the stream-K tiles ("Wide stages" in the module
        docstring: 64 bytes per weight row per stage, the block scales by TMA too; each lane
        reads its row's scales for both 64-k tiles of a stage with one ``ld.shared.b32`` at the
        stage's start, :meth:`W4A16WgmmaGemm.load_stage_scales`)."""
        return 128 if self.streamk else BLOCK_K

    @property
    def uses_setmaxnreg(self) -> bool:
        """Whether the kernel moves registers from the producer to the consumer warpgroups
        (``setmaxnreg``): with several consumer warpgroups and ``block_m >= 128`` (the 64 x
        ``block_m`` fp32 accumulator needs them). Below 128 ptxas drops the instruction anyway
        at 384 threads ("C7508: setmaxnreg ignored; unable to determine register count at
        entry"), and such a CTA needs 50-79 registers: without it, and without the
        shared-memory floor that goes with it (:meth:`W4A16WgmmaGemm.smem_bytes`), 2-3 CTAs fit
        per SM."""
        return self.consumers > 1 and self.block_m >= 128

    @property
    def features_per_cta(self) -> int:
        """Output features per CTA: 64 per row warpgroup (32 for SwiGLU: gate + up)."""
        return (32 if self.epilogue == "swiglu" else 64) * self.row_wgs

    @property
    def stage_bytes(self) -> int:
        scales = self.row_wgs * 64 * 16 if self.stage_k == 128 else 0
        return self.block_m * self.stage_k * 2 + self.row_wgs * 64 * (self.stage_k // 2) + scales

    @property
    def num_stages(self) -> int:
        fit = SMEM_BUDGET // self.stage_bytes
        return min(fit, self.stages) if self.stages else min(fit, 8)

    @property
    def name(self) -> str:
        return (
            f"{self.name_head}_r{self.row_wgs}"
            f"_s{self.split_k}_st{self.num_stages}{'_un' if self.unroll else ''}"
            f"{'_kp' if self.permuted else ''}"
            f"{'_pdl' if self.pdl else ''}{'_sib' if self.sibling else ''}"
            f"{self.order_tag}{f'_sk{self.streamk}' if self.streamk else ''}"
            f"{'_sa' if self.scale_ahead else ''}{f'_fx{self.flex}' if self.flex else ''}"
            f"{'_mx' if self.mx else ''}_{self.arch}"
        )

    @property
    def widths(self) -> tuple[int, ...]:
        """The token widths a CTA can run its tile at: multiples of ``flex`` up to
        ``block_m`` (just ``block_m`` without ``flex``)."""
        if not self.flex:
            return (self.block_m,)
        return tuple(range(self.flex, self.block_m + 1, self.flex))

    @property
    def partial_len(self) -> int:
        """fp32 values of one stream-K partial sum (all consumer warpgroups' accumulators)."""
        return self.consumers * 64 * self.block_m

    def streamk_units(self, num_rows: int) -> tuple[int, int]:
        """``(items, units)`` of a stream-K launch over ``num_rows`` tokens: output tiles and
        (tile, stage) pairs."""
        items = self.n_out // self.features_per_cta * -(-num_rows // self.block_m)
        return items, items * (self.k // self.stage_k)


def supported(n_out: int, k: int) -> bool:
    """Whether some config covers this problem (N_out % 64 == 0 and K % 64 == 0)."""
    return n_out % 64 == 0 and k % BLOCK_K == 0


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------


class W4A16WgmmaGemm(StreamKTiles):
    """The CuTeDSL kernel for one :class:`WgmmaConfig`; see the module docstring. The stream-K
    mode's producer, consumers and fix-up are in its base class
    (:class:`~nvfp4_ops.kernels.cute.streamk.StreamKTiles`)."""

    def __init__(self, cfg: WgmmaConfig) -> None:
        self.cfg = cfg
        self.stages = cfg.num_stages
        self.k_tiles = cfg.k // cfg.stage_k  # ring stages per output tile
        self.sub = cfg.stage_k // BLOCK_K  # 64-k activation boxes per stage
        self.num_boxes = 2 * cfg.row_wgs  # 32-row weight slots per stage
        # rows per weight TMA box: a slot, or with 128-k stages all of a stage's
        self.box_rows = 64 * cfg.row_wgs if self.sub > 1 else 32
        self.box_bytes = cfg.stage_k // 2  # per row
        self.w_stage_bytes = self.num_boxes * 32 * self.box_bytes  # weight bytes per stage
        self.threads = 128 * (cfg.consumers + 1)
        # bytes the TMA copies of a stage deliver (scale_ahead's cp.async ones arrive apart)
        self.tx_bytes = cfg.stage_bytes - (self.box_rows * 16 if cfg.scale_ahead else 0)
        # register split (setmaxnreg, only when cfg.uses_setmaxnreg): the producer warpgroup
        # gives registers back, the consumers take them. setmaxnreg moves registers only within
        # the CTA's own allocation, which ptxas fixes from the launch bound: 65536 / threads
        # rounded down to 8 (168 at 384 threads, 96 at 640: cuobjdump -res-usage). Asking for
        # more than that pool holds blocks setmaxnreg.inc forever (a hang: 24 + 4 x 120 > 5 x
        # 96 per lane of 640 threads), so the split is sized from the pool (24 + 4 x 112).
        self.entry_regs = min(255, 65536 // self.threads) // 8 * 8
        self.producer_regs = 40 if cfg.consumers < 4 else 24
        pool = self.entry_regs * self.threads - 128 * self.producer_regs
        self.consumer_regs = min(232, pool // (128 * cfg.consumers) // 8 * 8)

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        w: cute.Tensor,
        w_scale: cute.Tensor,
        w_global: cute.Tensor,
        out: cute.Tensor,
        tile_expert: cute.Tensor,
        tile_rows: cute.Tensor,
        row_scale: cute.Tensor,
        bias: cute.Tensor,
        counters: cute.Tensor,
        scratch: cute.Tensor,
        swiglu_limit: Float32,
        stream,
    ):
        cfg = self.cfg
        bm = cfg.block_m
        # activations: [block_m, 64] bf16 boxes, K-major, 128-byte swizzle (the WGMMA B layout)
        b_layout = self.b_layout(bm, self.stages * self.sub)
        # flex: boxes of `flex` token rows, as many per stage as the CTA's width needs
        box_m = cfg.flex if cfg.flex else bm
        tma_b, m_b = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), a,
            cute.slice_(self.b_layout(box_m, 1), (None, None, 0)), (box_m, BLOCK_K),
        )
        # weights as one [G*N, K/2] byte matrix: row expert*N + n; 32 x 32-byte boxes
        w2 = cute.make_tensor(
            w.iterator,
            cute.make_layout((w.shape[0] * cfg.n, cfg.k // 2), stride=(cfg.k // 2, 1)),
        )
        wb = self.box_bytes
        box_layout = cute.slice_(self.w_layout(1), (None, None, 0))
        tma_w, m_w = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), w2, box_layout, (self.box_rows, wb)
        )
        extra = ()
        if const_expr(self.sub > 1 and not cfg.scale_ahead):
            # block scales as one [G*N, K/16] byte matrix: a 16-byte box per row and stage
            # (scale_ahead copies them with cp.async instead: no TMA descriptor to encode)
            s2 = cute.make_tensor(
                w_scale.iterator,
                cute.make_layout((w.shape[0] * cfg.n, cfg.k // 16), stride=(cfg.k // 16, 1)),
            )
            extra = cpasync.make_tiled_tma_atom(
                cpasync.CopyBulkTensorTileG2SOp(), s2,
                cute.make_layout((self.box_rows, 16), stride=(16, 1)), (self.box_rows, 16))
        tiled_mma = cute.make_tiled_mma(
            warpgroup.MmaF16BF16Op(
                BFloat16, Float32, (64, bm, 16), warpgroup.OperandSource.RMEM,
                cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K,
            )
        )

        self.shared_storage = self.storage_struct(b_layout)
        num_rows = a.shape[0]
        grid_n = cfg.n_out // cfg.features_per_cta
        grid_m = (num_rows + (bm - 1)) // bm
        grid = [grid_n, grid_m, 1]
        if const_expr(cfg.streamk > 0):
            # as many CTAs as the scratch has two partial slots for
            # (nvfp4_ops.kernels.linear_cuda.streamk_workspace)
            grid = [scratch.shape[0] // (2 * cfg.partial_len), 1, 1]
            # (128-k stages: ``extra`` holds the scale TMA atom and its tensor, unless the
            # scales are copied a stage ahead)
            if const_expr(cfg.scale_ahead):
                extra = (None, None)
            extra = (*extra, None, counters, scratch)
        if const_expr(cfg.flex):
            extra = (None, None, tile_rows)
        self.kernel(
            tma_b, m_b, tma_w, m_w, w_scale, w_global, out, tile_expert, row_scale, bias,
            swiglu_limit, tiled_mma, b_layout, num_rows, *extra,
        ).launch(
            grid=grid,
            block=[self.threads, 1, 1],
            smem=self.smem_bytes(self.shared_storage.size_in_bytes()),
            stream=stream,
            use_pdl=cfg.pdl,
        )

    def b_layout(self, rows: int, boxes: int):
        """Shared-memory layout of ``boxes`` activation boxes of ``rows`` tokens x
        :data:`BLOCK_K` bf16 (K-major, 128-byte swizzle: the WGMMA B layout). Rows are tiled
        first, in 8-row atoms of 1024 bytes, so ``w / f`` consecutive boxes of ``f`` rows are
        the same bytes as one box of ``w`` rows (what the ``flex`` widths rely on; plain
        Python)."""
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, BFloat16)
        return cute.tile_to_shape(atom, (rows, BLOCK_K, boxes), order=(0, 1, 2))

    def w_layout(self, boxes: int):
        """Shared-memory layout of ``boxes`` weight boxes ``(box_rows, box_bytes)``, row-major;
        with 128-k stages 64-byte swizzled (16-byte unit ``u`` of row ``r`` at ``u ^ ((r >> 1)
        & 3)``), so the 8 rows of a load phase fall on distinct banks (plain Python)."""
        wb = self.box_bytes
        flat = cute.make_layout((self.box_rows, wb, boxes), stride=(wb, 1, self.box_rows * wb))
        if self.sub > 1:
            return cute.make_composed_layout(cute.make_swizzle(2, 4, 3), 0, flat)
        return flat

    def storage_struct(self, b_layout):
        """The CTA's shared memory as a ``cute.struct``: the full / empty mbarriers, the
        activation ring (``b_layout``), the weight boxes, and with ``streamk`` a word
        broadcasting the fix-up's count. Built from an annotation dict (the module's
        annotations are strings, which ``cute.struct`` evaluates only in a traced body)."""
        fields = {
            "bars": cute.struct.MemRange[Int64, 2 * self.stages],
            "s_b": cute.struct.Align[cute.struct.MemRange[BFloat16, cute.cosize(b_layout)], 1024],
            "s_w": cute.struct.Align[
                cute.struct.MemRange[cutlass.Uint8, self.stages * self.w_stage_bytes],
                1024 if self.sub > 1 else 128],
        }
        if self.sub > 1:
            fields["s_s"] = cute.struct.Align[
                cute.struct.MemRange[cutlass.Uint8, self.stages * self.box_rows * 16], 128]
        if self.cfg.streamk:
            fields["flag"] = cute.struct.MemRange[Int32, 4]
        return cute.struct(type("SharedStorage", (), {"__annotations__": fields}))

    def smem_bytes(self, storage: int) -> int:
        """Dynamic shared memory to request: the storage, and with ``setmaxnreg``
        (:attr:`WgmmaConfig.uses_setmaxnreg`) at least half the SM's 228 KiB, so such a CTA is
        always alone on its SM (its 168 or 96 registers per lane allow one CTA anyway; the
        floor keeps that true whatever ptxas allocates). Without ``setmaxnreg`` (block_m 16-64)
        there is no floor: 2-3 CTAs per SM fit there (50-79 registers, 50-99 KB), which the
        decode latency needs."""
        return max(storage, 116 * 1024) if self.cfg.uses_setmaxnreg else storage

    @cute.kernel
    def kernel(
        self,
        tma_b: cute.CopyAtom,
        m_b: cute.Tensor,
        tma_w: cute.CopyAtom,
        m_w: cute.Tensor,
        w_scale: cute.Tensor,
        w_global: cute.Tensor,
        out: cute.Tensor,
        tile_expert: cute.Tensor,
        row_scale: cute.Tensor,
        bias: cute.Tensor,
        swiglu_limit: Float32,
        tiled_mma: cute.TiledMma,
        b_layout: cute.ComposedLayout,
        num_rows: Int32,
        tma_s: cute.CopyAtom = None,
        m_s: cute.Tensor = None,
        tile_rows: cute.Tensor = None,
        counters: cute.Tensor = None,
        scratch: cute.Tensor = None,
    ):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = warp // 4

        expert = Int32(0)
        if const_expr(cfg.grouped):
            expert = tile_expert[bidy]

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(self.shared_storage)
        if const_expr(cfg.flex):
            if expert >= 0:
                # the tile's width class, from its real rows (the routing's, complete before
                # this grid launched: moe_cuda, "Launch overlap"); uniform over the CTA
                last = len(cfg.widths) - 1
                cls = cutlass.min(cutlass.max(tile_rows[bidy] - 1, 0) // cfg.flex, last)
                for c in cutlass.range_constexpr(last + 1):
                    if cls == c:
                        self.flex_tile(storage, cfg.widths[c], tma_b, m_b, tma_w, m_w,
                                       w_scale, w_global, out, row_scale, bias, swiglu_limit,
                                       expert, bidx, bidy, num_rows, tidx, warp, wg)
            elif const_expr(cfg.pdl):
                if bidx + bidy == 0:
                    cute.arch.griddepcontrol_wait()
            if const_expr(cfg.sibling):
                if bidx + bidy == 0:
                    cute.arch.griddepcontrol_wait()
        else:
            self.fixed_tile(storage, tma_b, m_b, tma_w, m_w, w_scale, w_global, out,
                            row_scale, bias, swiglu_limit, tiled_mma, b_layout, num_rows, tma_s,
                            m_s, expert, tidx, bidx, bidy, warp, wg, counters, scratch)

    def ring(self, storage, tx_count: int):
        """The full / empty mbarrier ring of the CTA's stages, each stage completing on
        ``tx_count`` bytes of TMA copies (plain Python, inlined while tracing)."""
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.bars.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     4 * self.cfg.row_wgs),
            tx_count=tx_count,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )

    @cute.jit
    def flex_tile(self, storage, width: int, tma_b, m_b, tma_w, m_w, w_scale, w_global, out,
                  row_scale, bias, swiglu_limit, expert, bidx, bidy, num_rows, tidx, warp,
                  wg):
        """A grouped tile run ``width`` tokens wide (``flex``): its own ring barriers (a stage
        delivers ``width`` activation rows), ring layout (stage stride ``width`` rows) and
        WGMMA of N = ``width``; the producer and consumer of the fixed-width path."""
        cfg = self.cfg
        pipe = self.ring(storage, width * BLOCK_K * 2 + self.w_stage_bytes)
        b_layout = self.b_layout(width, self.stages)
        s_b = storage.s_b.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        # the producer's view of the same bytes: `width / flex` boxes of `flex` rows per stage
        box_layout = self.b_layout(cfg.flex, self.stages * (width // cfg.flex))
        s_box = storage.s_b.get_tensor(box_layout.outer, swizzle=box_layout.inner)
        s_w = storage.s_w.get_tensor(self.w_layout(self.stages * self.num_boxes))
        tiled_mma = cute.make_tiled_mma(
            warpgroup.MmaF16BF16Op(
                BFloat16, Float32, (64, width, 16), warpgroup.OperandSource.RMEM,
                cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K,
            )
        )
        if wg == cfg.consumers:
            if const_expr(cfg.uses_setmaxnreg):
                cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp % 4 == 0:
                self.producer(pipe, tma_b, m_b, tma_w, m_w, s_box, s_w, expert, bidx, bidy,
                              width)
        else:
            if const_expr(cfg.uses_setmaxnreg):
                cute.arch.setmaxregister_increase(self.consumer_regs)
            self.consumer(pipe, tiled_mma, s_b, s_w, w_scale, w_global, out, row_scale,
                          bias, swiglu_limit, expert, bidx, bidy, num_rows, tidx, wg, width)

    @cute.jit
    def fixed_tile(self, storage, tma_b, m_b, tma_w, m_w, w_scale, w_global, out, row_scale,
                   bias, swiglu_limit, tiled_mma, b_layout, num_rows, tma_s, m_s, expert, tidx,
                   bidx, bidy, warp, wg, counters=None, scratch=None):
        """Every tile ``block_m`` tokens wide (dense, stream-K and grouped without ``flex``);
        ``counters`` / ``scratch``: the stream-K workspace (stream-K configs only)."""
        cfg = self.cfg
        pipe = self.ring(storage, self.tx_bytes)
        s_b = storage.s_b.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        w_layout = self.w_layout(self.stages * self.num_boxes * 32 // self.box_rows)
        if const_expr(self.sub > 1):
            s_w = storage.s_w.get_tensor(w_layout.outer, swizzle=w_layout.inner)
        else:
            s_w = storage.s_w.get_tensor(w_layout)
        s_s = None
        if const_expr(self.sub > 1):
            s_s = storage.s_s.get_tensor(cute.make_layout(
                (self.box_rows, 16, self.stages), stride=(16, 1, self.box_rows * 16)))

        if const_expr(cfg.streamk > 0):
            if wg == cfg.consumers:
                if const_expr(cfg.uses_setmaxnreg):
                    cute.arch.setmaxregister_decrease(self.producer_regs)
                if warp % 4 == 0:
                    self.producer_streamk(pipe, tma_b, m_b, tma_w, m_w, s_b, s_w, num_rows,
                                          tma_s, m_s, s_s, w_scale)
            else:
                if const_expr(cfg.uses_setmaxnreg):
                    cute.arch.setmaxregister_increase(self.consumer_regs)
                flag = storage.flag.get_tensor(cute.make_layout(4))
                self.consumer_streamk(pipe, tiled_mma, s_b, s_w, w_scale, w_global, out, bias,
                                      swiglu_limit, counters, scratch, flag, num_rows,
                                      tidx, wg, s_s)
        elif expert >= 0:
            if wg == cfg.consumers:
                if const_expr(cfg.uses_setmaxnreg):
                    cute.arch.setmaxregister_decrease(self.producer_regs)
                if warp % 4 == 0:
                    self.producer(pipe, tma_b, m_b, tma_w, m_w, s_b, s_w, expert, bidx, bidy)
            else:
                if const_expr(cfg.uses_setmaxnreg):
                    cute.arch.setmaxregister_increase(self.consumer_regs)
                self.consumer(pipe, tiled_mma, s_b, s_w, w_scale, w_global, out, row_scale,
                              bias, swiglu_limit, expert, bidx, bidy, num_rows, tidx, wg)
        elif const_expr(cfg.pdl):
            # a skipped tile: this grid must still not complete before the previous one
            if bidx + bidy == 0:
                cute.arch.griddepcontrol_wait()
        if const_expr(cfg.sibling):
            # nothing waited before working: CTA 0 waits now, so this grid completes only
            # after the previous one (a second wait of a skipped CTA 0 returns at once)
            if bidx + bidy == 0:
                cute.arch.griddepcontrol_wait()

    def tma_views(self, tma_b, m_b, tma_w, m_w, s_b, s_w, token_tile):
        """The producer's TMA partitions ``(t_sb, t_gb, t_sw, t_gw)``: the activation ring and
        the ``(block_m, BLOCK_K)`` tiles of token tile ``token_tile`` (None: of every token
        tile, for stream-K; with ``flex`` every ``(flex, BLOCK_K)`` box of every tile), the
        weight ring and every 32-row weight box (plain Python, inlined while tracing)."""
        if const_expr(self.cfg.flex):
            g_b = cute.local_tile(m_b, (self.cfg.flex, BLOCK_K), (None, None))
        else:
            g_b = cute.local_tile(m_b, (self.cfg.block_m, BLOCK_K), (token_tile, None))
        t_sb, t_gb = cpasync.tma_partition(
            tma_b, 0, cute.make_layout(1), cute.group_modes(s_b, 0, 2),
            cute.group_modes(g_b, 0, 2),
        )
        g_w = cute.local_tile(m_w, (self.box_rows, self.box_bytes), (None, None))
        t_sw, t_gw = cpasync.tma_partition(
            tma_w, 0, cute.make_layout(1), cute.group_modes(s_w, 0, 2),
            cute.group_modes(g_w, 0, 2),
        )
        return t_sb, t_gb, t_sw, t_gw

    @cute.jit
    def producer(self, pipe, tma_b, m_b, tma_w, m_w, s_b, s_w, expert, bidx, bidy,
                 width: int = 0):
        """One warp: per stage, the activation tile and ``2 * row_wgs`` weight boxes. With
        ``flex`` (``width`` tokens): ``width / flex`` activation boxes per stage, ``s_b``
        being the ring as boxes (:meth:`flex_tile`)."""
        cfg = self.cfg
        nb = self.num_boxes
        t_sb, t_gb, t_sw, t_gw = self.tma_views(tma_b, m_b, tma_w, m_w, s_b, s_w, bidy)
        acts = self.act_copies(tma_b, t_gb, t_sb, bidy, width)
        # 32-row box index of each weight box of this CTA (see the module docstring)
        base = expert * (cfg.n // 32)
        box_rows = []
        for i in cutlass.range_constexpr(nb):
            if const_expr(cfg.epilogue == "swiglu"):
                f0 = bidx * cfg.features_per_cta + 32 * (i // 2)
                box_rows.append(base + f0 // 32 + (i % 2) * (cfg.n // 64))
            else:
                box_rows.append(base + bidx * (2 * cfg.row_wgs) + i)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        first = 0
        if const_expr(cfg.pdl):
            # launch overlap: the first stages' weight boxes stream while the previous kernel
            # finishes; their activation tiles (its output) only after griddepcontrol.wait. Both
            # complete on the stage's barrier, so the consumers see whole stages either way
            first = min(self.stages, self.k_tiles)
            for pk in cutlass.range_constexpr(first):
                pipe.producer_acquire(state)
                wbar = pipe.producer_get_barrier(state)
                for i in cutlass.range_constexpr(nb):
                    cute.copy(tma_w, t_gw[(None, box_rows[i], pk)],
                              t_sw[(None, state.index * nb + i)], tma_bar_ptr=wbar)
                state.advance()
            if const_expr(not cfg.sibling):
                cute.arch.griddepcontrol_wait()
            early = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                 self.stages)
            for pk in cutlass.range_constexpr(first):
                acts(pk, early.index, pipe.producer_get_barrier(early))
                pipe.producer_commit(early)
                early.advance()
        for kt in cutlass.range(first, self.k_tiles, unroll=1):
            pipe.producer_acquire(state)
            bar = pipe.producer_get_barrier(state)
            acts(kt, state.index, bar)
            for i in cutlass.range_constexpr(nb):
                cute.copy(tma_w, t_gw[(None, box_rows[i], kt)],
                          t_sw[(None, state.index * nb + i)], tma_bar_ptr=bar)
            pipe.producer_commit(state)
            state.advance()

    def act_copies(self, tma_b, t_gb, t_sb, bidy, width: int):
        """``copy(kt, slot, bar)``: the TMA copies of k tile ``kt``'s activations of token
        tile ``bidy`` into ring slot ``slot``, on barrier ``bar``: one ``(block_m,
        BLOCK_K)`` box, or with ``flex`` the first ``width / flex`` boxes of ``flex`` rows
        (plain Python, inlined while tracing)."""
        cfg = self.cfg

        def copy(kt, slot, bar):
            if const_expr(cfg.flex):
                per_tile = cfg.block_m // cfg.flex
                boxes = width // cfg.flex
                for q in range(boxes):
                    cute.copy(tma_b, t_gb[(None, bidy * per_tile + q, kt)],
                              t_sb[(None, slot * boxes + q)], tma_bar_ptr=bar)
            else:
                cute.copy(tma_b, t_gb[(None, kt)], t_sb[(None, slot)], tma_bar_ptr=bar)

        return copy

    def load_stage_scales(self, sc, ss, index, kt, slot: int = 0, which: int = 0):
        """128-k stages: this lane's 4 scale bytes of stage ``kt`` (its row, both 32-k
        chunks of 64-k tile ``quad % 2``) converted into ``sc[0]`` / ``sc[1]`` (chunk 0 / 1,
        bf16x2 ``* 2^119``); :meth:`load_chunk` shuffles them from lane ``q`` (lo row) and
        ``2 + q`` (hi row) of the quad (plain Python)."""
        word = lds_u32_at(self.scale_addr(ss, index, kt, which), 0)
        sc[slot] = scale_pair_pre(word)
        sc[slot + 1] = scale_pair_pre(word >> 16)

    def scale_addr(self, ss, index, kt, which: int = 0):
        """Shared address of this lane's scale pair of stage ``kt`` in ring slot ``index``: the
        slot's 16-byte row box holds stages ``kt & ~1`` and ``kt | 1``; with ``scale_ahead``
        the slot's own stage (``which`` 0) and the next (1) (plain Python)."""
        if const_expr(self.cfg.scale_ahead):
            return ss + index * (self.box_rows * 16) + which * 8
        return ss + index * (self.box_rows * 16) + (kt % 2) * 8

    @cute.jit
    def consumer(self, pipe, tiled_mma, s_b, s_w, w_scale, w_global, out, row_scale, bias,
                 swiglu_limit, expert, bidx, bidy, num_rows, tidx, wg, width: int = 0):
        """A consumer warpgroup's tile: the k loop (:meth:`tile`), the split-K sum and the
        epilogue; ``width`` tokens wide with ``flex`` (``tiled_mma`` and ``s_b`` of that N)."""
        cfg = self.cfg
        width = width if width else cfg.block_m
        nsplit = cfg.split_k
        lt = tidx % 128
        wq = lt // 32  # warp within the warpgroup
        lane = lt % 32
        grp = lane // 4
        quad = lane % 4
        rq = wg % cfg.row_wgs  # which 64-A-row block
        sk = wg // cfg.row_wgs  # which k slice: k tiles sk, sk + split_k, ...
        sel = quad | ((quad + 4) << 4) | (quad << 8) | ((quad + 4) << 12)
        if const_expr(cfg.permuted):
            # this lane's 4 bytes of a 32-k row chunk hold k 8c .. 8c+7: block scale 2j + c/2 of
            # the tile for chunk j. Quad lane c converts the (lo, hi) pair of block c (one prmt
            # of the rows' scale words); chunk j takes it from quad lane 2j + c/2 (load_chunk)
            q2 = quad // 2
            sel = (q2, 2 + q2, quad | ((quad + 4) << 4))

        row_lo, row_hi = self.a_weight_rows(bidx, rq, wq, grp)
        w_smem = s_w.iterator.toint()
        off_lo, off_hi = self.a_row_offsets(rq, wq, grp, quad)
        stage_bytes_w = self.w_stage_bytes

        # block scales: 4 bytes (one per 16 k; mx: 2, one per 32 k) per row per stage, read one
        # tile ahead
        s_base = w_scale.iterator.toint() + Int64(expert) * Int64(cfg.n * (cfg.k // cfg.scale_k))
        s_lo, s_hi = self.scale_rows(s_base, row_lo, row_hi, quad)

        t_cb, acc, frags, raw, scl, sc = self.registers(tiled_mma, s_b, lt, width)
        acc.fill(0.0)

        if const_expr(cfg.pdl):
            # row scales (the gather's) and the output belong to the chain: wait for the
            # previous kernel (a sibling does not: config docstring), then let the next one
            # launch (moe_cuda, "Launch overlap")
            if const_expr(not cfg.sibling):
                cute.arch.griddepcontrol_wait()
            if tidx == 0:
                cute.arch.griddepcontrol_launch_dependents()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        if const_expr(nsplit > 1):
            state.advance(sk)
            rel.advance(sk)
        n_iter = self.k_tiles // nsplit
        self.load_scales(sc, 0, s_lo, s_hi, sk)
        pipe.consumer_wait(state)
        self.load_chunk(raw, scl, w_smem + state.index * stage_bytes_w, off_lo, off_hi,
                        sc[0], sc[1], 0, sel)
        # first tile (nothing to release yet), middle tiles, last tile (nothing to prefetch)
        self.load_scales(sc, 2, s_lo, s_hi, sk + nsplit)
        state, rel = self.tile(pipe, state, rel, tiled_mma, acc, frags, raw, scl, sc, t_cb,
                               w_smem, stage_bytes_w, off_lo, off_hi, sel, True, False)
        if const_expr(cfg.unroll):
            # rounds of `stages` middle tiles from tile 1 on, every tile's ring slot a constant
            # (ring_at); then the middle tiles past the last whole round, traced one by one
            rounds, rest = divmod(n_iter - 2, self.stages)
            for r in cutlass.range(rounds, unroll=1):
                for u in cutlass.range_constexpr(self.stages):
                    self.next_scales(sc, s_lo, s_hi, r * self.stages + 2 + u)
                    state, rel = self.ring_at(r, u)
                    self.tile(pipe, state, rel, tiled_mma, acc, frags, raw, scl, sc, t_cb,
                              w_smem, stage_bytes_w, off_lo, off_hi, sel, False, False)
            for u in cutlass.range_constexpr(rest):
                self.next_scales(sc, s_lo, s_hi, rounds * self.stages + 2 + u)
                state, rel = self.ring_at(rounds, u)
                self.tile(pipe, state, rel, tiled_mma, acc, frags, raw, scl, sc, t_cb, w_smem,
                          stage_bytes_w, off_lo, off_hi, sel, False, False)
            state, rel = self.ring_at(rounds, rest)  # the last tile's
        else:
            for it in cutlass.range(1, n_iter - 1, unroll=1):
                self.next_scales(sc, s_lo, s_hi, sk + (it + 1) * nsplit)
                state, rel = self.tile(pipe, state, rel, tiled_mma, acc, frags, raw, scl, sc,
                                       t_cb, w_smem, stage_bytes_w, off_lo, off_hi, sel, False,
                                       False)
        sc[0] = sc[2]
        sc[1] = sc[3]
        state, rel = self.tile(pipe, state, rel, tiled_mma, acc, frags, raw, scl, sc, t_cb,
                               w_smem, stage_bytes_w, off_lo, off_hi, sel, False, True)
        warpgroup.wait_group(0)

        if const_expr(nsplit > 1):
            # deterministic split-K: slices 1.. park their partial sums in the (now idle)
            # activation ring, slice 0 adds them in slice order
            nthreads = 128 * cfg.consumers
            acc_len = cute.size(acc)
            red = cute.make_tensor(
                cute.recast_ptr(s_b.iterator, dtype=Float32),
                cute.make_layout((128, acc_len, cfg.row_wgs, nsplit - 1),
                                 stride=(1, 128, 128 * acc_len, 128 * acc_len * cfg.row_wgs)),
            )
            cute.arch.barrier(barrier_id=1, number_of_threads=nthreads)
            if sk > 0:
                for i in cutlass.range_constexpr(acc_len):
                    red[lt, i, rq, sk - 1] = acc[i]
            cute.arch.barrier(barrier_id=1, number_of_threads=nthreads)
            if sk == 0:
                for s in cutlass.range_constexpr(nsplit - 1):
                    for i in cutlass.range_constexpr(acc_len):
                        acc[i] = acc[i] + red[lt, i, rq, s]
                self.epilogue(acc, w_global, out, row_scale, bias, swiglu_limit, expert, bidy,
                              num_rows, row_lo, row_hi, quad)
        else:
            self.epilogue(acc, w_global, out, row_scale, bias, swiglu_limit, expert, bidy,
                          num_rows, row_lo, row_hi, quad, width)

    def a_row_offsets(self, rq, wq, grp, quad):
        """``(off_lo, off_hi)``: byte offsets within a stage's weight boxes of the lane's two A
        rows (g and g + 8) of row warpgroup ``rq``, warp ``wq`` (see the module docstring; plain
        Python, inlined while tracing)."""
        if const_expr(self.cfg.epilogue == "swiglu"):
            slot_lo = 2 * rq
            slot_hi = 2 * rq + 1
            srow_lo = 8 * wq + grp
            srow_hi = 8 * wq + grp
        else:
            slot_lo = 2 * rq + wq // 2
            slot_hi = slot_lo
            srow_lo = 16 * (wq % 2) + grp
            srow_hi = srow_lo + 8
        rb = BLOCK_K // 2
        off_lo = slot_lo * 1024 + srow_lo * rb
        off_hi = slot_hi * 1024 + srow_hi * rb
        if const_expr(self.sub > 1):
            # 64-byte rows, swizzled (w_layout): rows g and g + 8 share the swizzle (g >> 1) & 3
            row = 64 * rq + 16 * wq + grp
            off_lo = row * self.box_bytes + ((grp >> 1) & 3) * 16 + 4 * quad
            return off_lo, off_lo + 8 * self.box_bytes
        if const_expr(self.cfg.permuted or self.cfg.order.fragment_order):
            off_lo = off_lo + 4 * quad
            off_hi = off_hi + 4 * quad
        return off_lo, off_hi

    def a_weight_rows(self, tile_n, rq, wq, grp):
        """``(row_lo, row_hi)``: the weight rows (of the group) of the lane's two A rows in
        feature tile ``tile_n``; for ``swiglu`` a feature's gate row and its up row ``+ N/2``
        (plain Python, inlined while tracing)."""
        cfg = self.cfg
        if const_expr(cfg.epilogue == "swiglu"):
            feat = tile_n * cfg.features_per_cta + 32 * rq + 8 * wq + grp
            return feat, feat + cfg.n // 2
        row_lo = tile_n * cfg.features_per_cta + 64 * rq + 16 * wq + grp
        return row_lo, row_lo + 8

    def registers(self, tiled_mma, s_b, lt, width: int = 0):
        """A consumer thread's MMA state (plain Python, inlined while tracing): ``(t_cb, acc,
        frags, raw, scl, sc)``: its B fragments of the activation ring, the fp32 accumulators
        (64 A rows x ``width`` tokens per warpgroup, ``block_m`` by default; not zeroed),
        the A-fragment buffers
        ``[chunk buffer][k16 step]``, and the next chunk's raw weight words (rows lo, hi), its
        block scales (packed bf16x2 pairs, :meth:`load_chunk`) and the raw scale words
        ``[lo, hi] x [this, next tile]``, loaded before the wait for the previous WGMMAs so
        their latency hides behind it. Sets the MMA to accumulate."""
        thr_mma = tiled_mma.get_slice(lt)
        t_cb = tiled_mma.make_fragment_B(thr_mma.partition_B(s_b))
        width = width or self.cfg.block_m
        acc = cute.make_rmem_tensor(tiled_mma.partition_shape_C((64, width)),
                                    Float32)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        a_shape = tiled_mma.partition_shape_A((64, 16))
        frags = [cute.make_rmem_tensor(a_shape, BFloat16) for _ in range(4)]
        raw = cute.make_rmem_tensor(cute.make_layout(8), Int32)
        scl = cute.make_rmem_tensor(cute.make_layout(3), Int32)
        sc = cute.make_rmem_tensor(cute.make_layout(4), Int32)
        return t_cb, acc, frags, raw, scl, sc

    def scale_rows(self, s_base, row_lo, row_hi, quad):
        """Global addresses of the block scales this lane loads (plain Python, inlined while
        tracing): rows lo and hi; with ``wfrag`` one address, the lane's share of its quad's
        scales (see :meth:`load_scales`), twice."""
        kb16 = self.cfg.k // self.cfg.scale_k  # scale bytes per row
        if const_expr(self.cfg.order.fragment_order):
            mine = row_lo + (quad // 2) * (row_hi - row_lo)
            addr = s_base + Int64(mine) * Int64(kb16) + Int64(2 * (quad % 2))
            return addr, addr
        return s_base + Int64(row_lo) * Int64(kb16), s_base + Int64(row_hi) * Int64(kb16)

    def load_scales(self, sc, slot: int, s_lo, s_hi, k_tile):
        """Raw block scales of k tile ``k_tile`` (4 per row) into ``sc[slot]`` / ``sc[slot +
        1]`` (rows lo / hi). ``wfrag``: the four lanes of a quad share their rows, so each
        loads one pair: the lo row (quad lanes 0-1) or the hi row (2-3), first or second 32-k
        chunk (even / odd lanes), into ``sc[slot]``; :meth:`load_chunk` converts it once and
        hands the pairs round by shuffles (plain Python, inlined while tracing)."""
        if const_expr(self.cfg.order.fragment_order):
            sc[slot] = ld_u16(s_lo + Int64(k_tile * 4))
        elif const_expr(self.cfg.mx):
            sc[slot] = ld_u16(s_lo + Int64(k_tile * 2))
            sc[slot + 1] = ld_u16(s_hi + Int64(k_tile * 2))
        else:
            sc[slot] = ldg_u32(s_lo + Int64(k_tile * 4))
            sc[slot + 1] = ldg_u32(s_hi + Int64(k_tile * 4))

    def load_chunk(self, raw, scl, stage_w, off_lo, off_hi, sc_lo, sc_hi, j: int, sel,
                   q: int = 0):
        """Shared-memory words of 32-k chunk ``j`` (rows lo, hi) and its block scales, as packed
        bf16x2 pairs ``* 2^119`` (:func:`~nvfp4_ops.kernels.cute.fp4_ptx.scale_pair_pre`;
        :meth:`decode_mma` splits them next to their use, where the split is free). ``kperm``:
        the lane's one word per row, ``scl[0]`` = (lo row's scale, hi row's), shuffled from the
        quad lane that converted that block's pair (``sel``: the source lanes of chunks 0 and
        1, and this lane's own prmt selector; ``scl[2]`` keeps its conversion); ``wfrag``: one
        word per row, ``scl[0]`` / ``scl[1]`` = the lo / hi row's two scales, shuffled from the
        quad lane that converted them (``sc_lo``: this lane's raw pair, read at ``j == 0``;
        ``scl[2]`` keeps its conversion for ``j == 1``); natural: the rows' four words each,
        scales as ``wfrag`` but each lane converts its own.

        Plain Python (no ``cute.jit``): inlined while the kernel is traced.
        """
        if const_expr(self.cfg.permuted):
            raw[0] = lds_u32_at(stage_w + off_lo, 16 * j)
            raw[1] = lds_u32_at(stage_w + off_hi, 16 * j)
            if const_expr(self.cfg.mx):
                # chunk j is one MX block: every lane of the quad takes the rows' byte j
                scl[0] = mx_pair_pre(sc_lo, sc_hi, j)
                return
            if const_expr(j == 0):
                scl[2] = scale_pair_pre(prmt(sc_lo, sc_hi, sel[2]))
            scl[0] = shfl_quad_from(scl[2], sel[j])
            return
        if const_expr(self.cfg.order.fragment_order):
            if const_expr(self.sub > 1):
                # 32-k chunk 2q + j of the stage: its 16-byte unit, swizzled (w_layout)
                addr = stage_w + off_lo
                if const_expr(2 * q + j > 0):
                    addr = addr ^ ((2 * q + j) * 16)
                raw[0] = lds_u32_at(addr, 0)
                raw[1] = lds_u32_at(addr, 8 * self.box_bytes)
            else:
                raw[0] = lds_u32_at(stage_w + off_lo, 16 * j)
                raw[1] = lds_u32_at(stage_w + off_hi, 16 * j)
            if const_expr(self.sub > 1):
                # sc_lo: this lane's converted pair of chunk j (load_stage_scales); the lo row's
                # of 64-k tile q sits in quad lane q, the hi row's in lane 2 + q
                scl[0] = shfl_quad(sc_lo, q)
                scl[1] = shfl_quad(sc_lo, 2 + q)
                return
            # the quad's pairs (lo row chunk 0, chunk 1, hi row chunk 0, chunk 1) sit in its
            # lanes 0-3 (load_scales): convert this lane's once per tile, keep it in scl[2]
            if const_expr(j == 0):
                scl[2] = scale_pair_pre(sc_lo)
            scl[0] = shfl_quad(scl[2], j)
            scl[1] = shfl_quad(scl[2], 2 + j)
            return
        lo = ld_shared_v4_at(stage_w + off_lo, 16 * j)
        hi = ld_shared_v4_at(stage_w + off_hi, 16 * j)
        for e in range(4):
            raw[e] = lo[e]
            raw[4 + e] = hi[e]
        scl[0] = scale_pair_pre(sc_lo >> (16 * j))
        scl[1] = scale_pair_pre(sc_hi >> (16 * j))

    def decode_mma(self, tiled_mma, acc, frags, raw, scl, sel, t_cb, stage_idx, j: int,
                   q: int = 0):
        """Decode the loaded chunk into A-fragment buffer ``j``, issue its two k16 WGMMAs.

        ``kperm``: ``pair4`` word j = physical k ``(8c + j, 8c + j + 4)``, which the permuted
        activations hold at logical k ``16 s + 8 h + 2c + {0, 1}`` for ``j = 2 s + h``: the
        same register slots as the gathered decode's (step s, half h)."""
        if const_expr(self.cfg.permuted):
            decode = decode_word_wperm if self.cfg.order.wperm_bits else decode_word_pair4
            s_lo, s_hi = bf16x2_halves(scl[0])
            d_lo = decode(raw[0], s_lo)
            d_hi = decode(raw[1], s_hi)
        elif const_expr(self.cfg.order.fragment_order):
            # wfrag word: register j = natural k pair 8j + 2c + {0, 1}, the same slots as the
            # gathered decode's (step s = j // 2 with its block scale, half h = j % 2)
            decode2 = decode_word_wperm_2s if self.cfg.order.wperm_bits else decode_word_pair4_2s
            d_lo = decode2(raw[0], *bf16x2_halves(scl[0]))
            d_hi = decode2(raw[1], *bf16x2_halves(scl[1]))
        else:
            d_lo = gather_decode(raw[0], raw[1], raw[2], raw[3], sel, *bf16x2_halves(scl[0]))
            d_hi = gather_decode(raw[4], raw[5], raw[6], raw[7], sel, *bf16x2_halves(scl[1]))
        for s in range(2):
            f32v = cute.recast_tensor(frags[2 * j + s], Int32)
            f32v[0] = d_lo[2 * s]
            f32v[1] = d_hi[2 * s]
            f32v[2] = d_lo[2 * s + 1]
            f32v[3] = d_hi[2 * s + 1]
        slot = stage_idx
        if const_expr(self.sub > 1):
            slot = stage_idx * self.sub + q  # the stage's activation box q
        warpgroup.fence()
        for s in range(2):
            cute.gemm(tiled_mma, acc, frags[2 * j + s][(None, None, 0)],
                      t_cb[(None, None, 2 * j + s, slot)], acc)
        warpgroup.commit_group()

    def next_scales(self, sc, s_lo, s_hi, k_tile) -> None:
        """Between two k tiles: the loaded raw scales become this tile's (``sc[0..1]``) and
        k tile ``k_tile``'s are loaded into ``sc[2..3]`` (plain Python, inlined)."""
        sc[0] = sc[2]
        sc[1] = sc[3]
        self.load_scales(sc, 2, s_lo, s_hi, k_tile)

    def ring_at(self, r, u: int):
        """``(state, rel)`` of k tile ``t = r * stages + 1 + u`` of an unrolled loop (``unroll``,
        ``split_k = 1``; ``r`` may be a runtime round, ``u < stages`` is a constant): the tile
        reads ring slot ``t % stages = (1 + u) % stages``, a constant, at phase ``(t // stages)
        & 1``, and releases the slot before it (plain Python, inlined)."""
        nst = self.stages
        slot = (1 + u) % nst
        phase = (r + (1 + u) // nst) & 1
        state = pipeline.PipelineState(nst, Int32(0), Int32(slot), Int32(phase))
        rel = pipeline.PipelineState(nst, Int32(0), Int32((slot - 1) % nst), Int32(0))
        return state, rel

    def tile(self, pipe, state, rel, tiled_mma, acc, frags, raw, scl, sc, t_cb, w_smem,
             stage_bytes_w, off_lo, off_hi, sel, first: bool, last: bool, q: int = 0,
             ss=None):
        """One 64-k tile of this warpgroup (two chunks); on entry ``raw``/``scl`` hold chunk 0.

        Per chunk: decode + WGMMA, then load the next chunk (for chunk 1: wait for this
        warpgroup's next tile first), then wait until only this chunk's WGMMAs are in flight
        (the other A buffer is free again). The previous tile's ring slot is released once
        its last WGMMAs have retired (after chunk 0's wait).
        """
        nsplit = self.cfg.split_k
        idx = state.index
        stage_w = w_smem + idx * stage_bytes_w
        stage_sc = self.sub > 1  # the stage's scales in registers (load_stage_scales)
        self.decode_mma(tiled_mma, acc, frags, raw, scl, sel, t_cb, idx, 0, q)
        self.load_chunk(raw, scl, stage_w, off_lo, off_hi, sc[1] if stage_sc else sc[0], sc[1],
                        1, sel, q)
        if const_expr(stage_sc and self.cfg.scale_ahead and q == 0 and not last):
            # the next stage's scales, from this slot, while this chunk's WGMMAs run
            self.load_stage_scales(sc, ss[0], idx, None, 2, 1)
        warpgroup.wait_group(1)
        if not first and q == 0:
            pipe.consumer_release(rel)
            rel.advance(nsplit)
        self.decode_mma(tiled_mma, acc, frags, raw, scl, sel, t_cb, idx, 1, q)
        if q == self.sub - 1:
            state.advance(nsplit)
            if not last:
                pipe.consumer_wait(state)
                if const_expr(stage_sc and self.cfg.scale_ahead):
                    sc[0] = sc[2]
                    sc[1] = sc[3]
                elif const_expr(stage_sc):
                    self.load_stage_scales(sc, ss[0], state.index, ss[1])
                self.load_chunk(raw, scl, w_smem + state.index * stage_bytes_w, off_lo, off_hi,
                                sc[0] if stage_sc else sc[2], sc[3], 0, sel)
        else:
            # the stage's next 64-k tile: already waited for
            self.load_chunk(raw, scl, stage_w, off_lo, off_hi, sc[0] if stage_sc else sc[2],
                            sc[3], 0, sel, q + 1)
        warpgroup.wait_group(1)
        return state, rel

    @cute.jit
    def epilogue(self, acc, w_global, out, row_scale, bias, swiglu_limit, expert, bidy,
                 num_rows, row_lo, row_hi, quad, width: int = 0):
        """Accumulator element ``i = v0 + 2 v1 + 4 j``: A row g + 8 v1, token 8j + 2c + v0 of
        the tile's first ``width`` tokens (``block_m`` by default)."""
        cfg = self.cfg
        width = width if width else cfg.block_m
        # the shift decoder feeds the MMA e2m1 * scale * 2^-7: scaling back by 2^7 is exact
        g_lo = row_global(cfg, w_global, expert, row_lo) * Float32(128.0)
        if const_expr(cfg.epilogue == "swiglu"):
            # row_lo is output feature f's gate row, row_hi = f + N/2 its up row
            g_hi = row_global(cfg, w_global, expert, row_lo, up=True) * Float32(128.0)
        else:
            g_hi = row_global(cfg, w_global, expert, row_hi) * Float32(128.0)
        b_lo = Float32(0.0)
        b_hi = Float32(0.0)
        if const_expr(cfg.has_bias):
            b_lo = bias[row_lo].to(Float32)
            b_hi = bias[row_hi].to(Float32)
        m0 = bidy * cfg.block_m
        col_lo = row_lo
        if const_expr(cfg.permuted and cfg.epilogue == "swiglu"):
            # GEMM 2 reads this output k-permuted: feature f goes to 32 (f/32) + dst(f % 32)
            f = row_lo % 32
            col_lo = row_lo - f + 8 * (f % 4) + f // 4
        for j in cutlass.range_constexpr(width // 8):
            for v0 in cutlass.range_constexpr(2):
                token = m0 + 8 * j + 2 * quad + v0
                if token < num_rows:
                    lo = acc[4 * j + v0] * g_lo
                    hi = acc[4 * j + 2 + v0] * g_hi
                    if const_expr(cfg.epilogue == "swiglu"):
                        v = clamped_swiglu(lo, hi, swiglu_limit)
                        out[token, col_lo] = v.to(BFloat16)
                    else:
                        if const_expr(cfg.epilogue == "row_scale"):
                            rs = row_scale[token]
                            lo = lo * rs
                            hi = hi * rs
                        if const_expr(cfg.has_bias):
                            lo = lo + b_lo
                            hi = hi + b_hi
                        out[token, row_lo] = lo.to(BFloat16)
                        out[token, row_hi] = hi.to(BFloat16)


def compile_gemm(cfg: WgmmaConfig, extra_options: str = ""):
    """Compile ``cfg`` for sm_90a from fake tensors, no GPU needed (the tvm-ffi callable of
    :func:`nvfp4_ops.kernels.cute.gemm_interface.compile_from_fakes`)."""
    return compile_from_fakes(W4A16WgmmaGemm(cfg), cfg, scale_align=4,
                              extra_options=extra_options)
