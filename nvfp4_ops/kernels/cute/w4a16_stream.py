"""Exact W4A16 NVFP4 grouped GEMM for decode on Hopper (sm_90a): weights streamed global ->
shared memory by the bulk-copy (TMA) engine through an mbarrier pipeline. CuTeDSL.

Same contract and math as :mod:`nvfp4_ops.kernels.cute.w4a16_gemm` (read its module docstring
for the interface): ``out[p, n] = epilogue(sum_k a[p, k] * e2m1[g, n, k] * block_scale[g, n,
k//16] * global[g, n])`` for every token row ``p`` of an m-tile whose group is ``g =
tile_expert[tile]`` (``-1`` = skip, rows never written), epilogues ``none`` (+ bias),
``swiglu`` (gate rows ``[0, N/2)``, up rows ``[N/2, N)``, each with its own global) and
``row_scale``. Arguments, in order: ``a`` bf16 ``[P, K]``, ``w`` u8 ``[G, N, K/2]``,
``w_scale`` u8 (e4m3 bytes) ``[G, N, K/16]``, ``w_global`` fp32 ``[G, H2, N/H2]`` (any
strides; ``global[g, n]`` its row ``n``, as in ``w4a16_gemm``), ``out`` bf16
``[P, N_out]``, ``tile_expert`` i32 ``[ceil(P / block_m)]``, ``row_scale`` fp32 ``[P]``,
``bias`` bf16 ``[N]``, ``counters`` / ``scratch`` (unused here; one-element dummies when
unused), ``swiglu_limit`` fp32, stream.
``P`` is symbolic; the grid is ``(N_out / rows_out_per_cta, ceil(P / block_m))``, or with
``ctas > 0`` (persistent) ``min(that many work items, ctas)`` CTAs, each taking items ``i, i +
gridDim.x, ...`` with one pipeline that runs on across them (the producer streams the next
item while the consumers reduce and store the last one).

CTA structure (warp specialised)
--------------------------------
* One producer warp. Each of its lanes owns one weight row of the CTA (16 rows, twice that
  for SwiGLU: gate rows and the matching up rows) and, per K chunk of ``kc =
  128 * warps_k * steps`` values, issues two ``cp.async.bulk`` copies (``kc/2`` code bytes,
  ``kc/16`` scale bytes; checkpoint layout, no re-layout) into stage ``c % stages`` of a ring of
  ``stages`` buffers, completing on that stage's *full* mbarrier (transaction bytes). Before
  refilling a stage it waits on the stage's *empty* mbarrier.
* ``warps_k`` consumer warps. Consumer ``w`` takes the 128-k steps ``w, w + warps_k, ...`` of
  each chunk for all the CTA's rows (deterministic in-CTA split-K: partial sums are added in
  warp order through shared memory at the end, no atomics), and arrives on *empty* (all 32
  lanes) once it has read a stage.
* At exit thread 0 invalidates the mbarriers: the PTX ISA requires it before the shared
  memory is used for anything else (the next CTA on the SM).

Stage release
-------------
A plain ``mbarrier.arrive`` on *empty* right after the last ``ld.shared`` of a stage is not
enough: ptxas may schedule the arrive before the MMAs that consume the loaded registers, and
the next round's bulk copy (async proxy) then overwrites data not yet read (seen on an H200 as
nondeterministic wrong outputs). Each consumer warp therefore issues
``fence.proxy.async.shared::cta`` before its arrive, the memory-model answer for generic reads
followed by async-proxy writes.

Shared-memory layout of a stage: weight row ``r`` at ``r * w_stride`` (``w_stride = kc/2`` plus
64 bytes when ``kc/2`` is a multiple of 128), then the scale rows at ``s_stride`` (an odd
multiple of 16 bytes). A consumer lane ``(g, c)`` (``g = lane / 4``, ``c = lane % 4``) reads 16
bytes of rows ``g`` and ``g + 8`` at column ``64 * step + 16 c`` (physical k ``32c .. 32c + 31``
of the step, the same per-lane k chunk as w4a16_gemm): each 8-lane phase of the 128-bit load
touches two rows 64 bytes apart modulo 128, so the loads are bank-conflict free; likewise the
2-byte scale loads (8 rows at distinct 16-byte offsets modulo 128).

With ``tma2d`` the producer fills a stage with TMA tensor copies, one box of 16 weight rows
per operand and row set (SwiGLU: the gate rows' box, then the up rows'), instead of two bulk
copies per weight row. The codes, viewed as ``(64 bytes, G*N rows, K/128 column groups)``, in
boxes ``(64, 16, kc/128)``; the scales, viewed as ``(16 bytes, G*N, K/(16 scale_k))``, in boxes
``(16, 16, kc/(16 scale_k))`` (one tensor map per operand over every expert's rows: a grouped
box starts at row ``expert * N + row``). A stage then holds each box's codes column group by
column group (group ``γ`` = one consumer step's 64 bytes per row: ``[box][kc/128][16][64]``),
then the scales (``[box][kc/(16 scale_k)][16][16]``: a 16-byte group holds the scales of 2
steps, or 4 with ``mx``). Consumer ``w``'s step ``u`` is group ``warps_k u + w``. An 8-lane
phase of its 16-byte code loads covers rows ``g`` and ``g + 1`` at 64-byte row stride (128
contiguous bytes), and its scale loads fall on 8 rows x 16 bytes: both conflict free. The
MMAs and their order are those of the per-row layout, so outputs are bitwise the same.

FP4 decode (``pair4``): a lane's u32 word holds 8 codes of physical k ``p .. p+7`` (code ``j``
in nibble ``j``). Output register ``j`` (``j = 0..3``) pairs code ``j`` (low bf16) with code
``j+4`` (high bf16): ``r = word << (12 - 4j)`` puts both nibbles at bits 12-15 / 28-31 (sign bits
in place), ``q = word << (6 - 4j)`` (or ``(word >> 8) << (14 - 4j)`` for ``j >= 2``) puts the 3
magnitude bits at bits 6-8 / 22-24, and ``(r & 0x80008000) | (q & 0x01C001C0)`` is exactly
``e2m1 * 2^-126`` per bf16, as in fp4_ptx.decode_word_shift; one bf16x2 multiply by
``block_scale * 2^119`` gives ``e2m1 * block_scale * 2^-7`` (exact; the epilogue multiplies the
fp32 accumulator by 2^7). Per pair that is 2 logic ops + 2 left shifts, which ptxas emits as
IMAD.SHL on the multiply pipe (SASS per u32 word: 8 LOP3, ~7 IMAD.SHL, 1-2 SHF), instead of a
byte permute + 3 logic/shift ops, all on the integer ALU pipe, for ``shift``. Pairing
``(j, j+4)`` instead of ``(2j, 2j+1)`` changes the MMA's k order only; the activation B
fragment takes the same pairs with one ``prmt`` per register: from the 16-byte load ``x0..x3``
of ``a[token, p:p+8]``, ``(p+j, p+j+4)`` is ``prmt(x[j/2], x[j/2 + 2])`` (low or high halves).
MMA ``s`` of a word (``mma.sync.m16n8k16``, weights as A with rows on M, tokens as B on N) takes
pairs ``2s`` and ``2s + 1`` as its logical k ``{2c, 2c+1}`` and ``{2c+8, 2c+9}``.

Pair-order activations (``act_order='pair'``, grouped only: the MoE's 8-token tiles): when ``a``
holds every 8-block of k in the ``pair`` order of :mod:`nvfp4_ops.orders.kperm` (stored position
``2j`` = k ``j``, ``2j + 1`` = k ``j + 4``), the 16-byte load ``x0..x3`` is already ``(p+j,
p+j+4)`` in ``x_j``: the B fragment is the loaded words, no ``prmt`` (4 per word index and token
tile). A ``swiglu`` output is then written in the same order (it is GEMM 2's ``a``): feature
``f`` at column ``8 (f // 8) + pair_dst(f % 8)``; ``none`` / ``row_scale`` outputs stay natural.

Launch overlap (``pdl``, grouped only: the MoE chain). The kernel is launched with programmatic
dependent launch, so it can start while the previous kernel on the stream (the MoE gather, or
GEMM 1 for GEMM 2) is still running. The producer warp then reads ``tile_expert`` and streams
its first stages of weights at once; the consumer warps execute ``griddepcontrol.wait`` before
they read ``tile_rows``, the activations or the row scales or write anything, and thread 0 then
lets the next kernel launch (``griddepcontrol.launch_dependents``). Reading ``tile_expert``
early is safe only because it was written two kernels back: the routing kernel precedes the
gather, whose every CTA waits for the routing before it lets this kernel launch (the ordering
argument is in ``moe_cuda``'s docstring). A CTA with no real tile does not wait, except CTA 0
(with tile 0 always real when any is), so the grid cannot complete before the previous one.

MXFP4 scales (``mx``, grouped pair order: the MoE on DeepSeek's own checkpoints). ``w_scale`` holds
one UE8M0 byte per 32 k (``[G, N, K/32]``), a stage ``kc/32`` bytes per row (a bulk copy of
16 bytes or more: ``kc >= 512``). A lane's 32 k of a step are exactly one MX block, so it
reads one byte where it read an e4m3 pair, and one ``mad`` makes the decoders' bf16x2 scale
(:func:`~nvfp4_ops.kernels.cute.fp4_ptx.mx_scale_pre`) where e4m3 took a conversion chain:
fewer bytes streamed and fewer instructions per weight, the same MMAs on the same values.

Activations stay global (L1/L2-resident at decode): one 16-byte load per (token, lane, word),
with the token clamped to ``P - 1`` so no row past ``P`` is read.

Padding rows (grouped): ``tile_rows[tile]`` says how many leading rows of the tile are real
tokens; the lanes of the other rows load the activations of the last real row instead of the
padding zeros. Their outputs (padding rows, never read downstream) are then copies of that
row's, and the warp's activation load touches fewer distinct addresses: at MoE decode most of
an 8-row tile is padding at MoE decode.

What limits it: the consumers' decode, not the copies (``nvfp4_ops/kernels/DESIGN.md``,
"Decode kernels"). The tile shape for a problem is chosen by :mod:`nvfp4_ops.kernels.dispatch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, const_expr
from cutlass.cute.nvgpu import cpasync

from nvfp4_ops.kernels.cute.fp4_ptx import (
    decode_reg_pair4,
    decode_reg_wperm,
    decode_word_pair4,
    decode_word_wperm,
    ld_shared_v4_at,
    ld_v4_at,
    mma_m16n8k16,
    mx_scale_pre,
    scales_to_bf16x2_pre,
)
from nvfp4_ops.kernels.cute.gemm_interface import (
    EPILOGUES,
    DirectLaunch,
    GemmProblem,
    compile_from_fakes,
    epilogue_value,
)
from nvfp4_ops.kernels.cute.ptx import (
    bulk_g2s,
    fence_proxy_async,
    lds_u8,
    lds_u16,
    mbar_arrive,
    mbar_arrive_expect_tx,
    mbar_init,
    mbar_inval,
    mbar_wait,
    pair_halves,
)
from nvfp4_ops.orders import WeightOrder
from nvfp4_ops.orders.kperm import NATURAL, PAIR

__all__ = [
    "BLOCK_MS",
    "EPILOGUES",
    "StreamConfig",
    "W4A16StreamGemm",
    "compile_gemm",
    "supported",
]

#: token tiles: 8 (decode). A second 8-token column doubles the MMAs and activation loads
#: per decoded word, and at 16 tokens the MoE was faster on WGMMA (DESIGN.md, section 2)
BLOCK_MS = (8,)
#: bytes of shared memory an sm_90 CTA may use (227 KB)
_SMEM_LIMIT = 227 * 1024
_BAR_BYTES = 128  # full[8] + empty[8] mbarriers
#: weight rows per MMA row set (the m16n8k16 A operand's rows)
SET_ROWS = 16


def _odd16(nbytes: int) -> int:
    """Smallest multiple of 16 >= nbytes that is an odd multiple of 16 (bank-conflict free
    2-byte scale loads: 8 rows land on 8 distinct 16-byte slots modulo 128)."""
    v = -(-nbytes // 16)
    return 16 * (v if v % 2 == 1 else v + 1)


@dataclass(frozen=True)
class StreamConfig(GemmProblem):
    """Everything that changes the generated code (P and G are symbolic).

    The problem fields of :class:`GemmProblem`, then ``warps_k``: consumer warps (split K
    inside the CTA); ``steps``: 128-k steps per consumer per stage (stage K chunk ``kc = 128 *
    warps_k * steps``); ``stages``: pipeline depth; ``ctas``: persistent launch (at most that
    many CTAs loop over the work items; 0 = one CTA per item); ``act_order``: pair-order
    activations (module docstring).
    """

    PREFIX: ClassVar[str] = "w4a16s"
    BLOCK_MS: ClassVar[tuple[int, ...]] = BLOCK_MS
    PERMUTED_ORDER: ClassVar[str] = PAIR

    block_m: int = 8
    warps_k: int = 4
    steps: int = 2
    stages: int = 4
    #: persistent launch: at most ``ctas`` CTAs, each looping over (feature tile, token tile)
    #: work items with one pipeline that runs on across items (0 = one item per CTA)
    ctas: int = 0
    #: the activations' k order (operand B): ``natural``, or ``pair`` (:mod:`nvfp4_ops.orders.
    #: kperm`: the B fragment is the loaded words, no ``prmt``; a SwiGLU output is written in
    #: that order too, the MoE's GEMM 1 feeding GEMM 2; grouped problems only)
    act_order: str = NATURAL
    #: launch overlap: ``none`` or ``after`` (programmatic dependent launch, the producer
    #: streaming weights before the previous kernel has finished: module docstring, "Launch
    #: overlap"; grouped problems only)
    overlap: str = "none"
    #: how the weight codes are stored: CHECKPOINT; WPERM (the ``wperm`` bit order of
    #: :mod:`nvfp4_ops.orders.wperm`: a cheaper decode, bitwise the same MMAs); or WFRAG (the
    #: fragment order of :mod:`nvfp4_ops.orders.wfrag` with those bits, natural activations:
    #: word ``i``'s register ``j`` meets the activation u32 ``4 j + i`` of the lane's 32-k
    #: block, element ``i`` of the block's ``j``-th 16-byte load, so the B fragments are loaded
    #: words, no ``prmt``: :meth:`mma_step`)
    order: WeightOrder = WeightOrder.CHECKPOINT
    #: the producer fills a stage with TMA tensor copies (per operand one box per 16-row
    #: set) instead of two bulk copies per weight row, into a layout grouped by 64-byte
    #: column (one consumer step): ``tma2d`` in the module docstring's "Shared-memory layout"
    tma2d: bool = False
    #: MXFP4 block scales: ``w_scale`` holds one UE8M0 byte per 32 k (``[G, N, K/32]``, bytes
    #: in ``format.MXFP4_KERNEL_SCALE_BYTES``) instead of one e4m3 per 16 (module docstring, "MXFP4
    #: scales"); grouped pair-order problems with 512-k chunks or more (16-byte scale copies)
    mx: bool = False
    arch: str = "sm_90a"

    def __post_init__(self) -> None:
        self.check_problem()
        if self.permuted and not self.grouped:
            raise ValueError("pair-order activations are for grouped problems only")
        if self.order.fragment_order and self.permuted:
            raise ValueError("wfrag (fragment-order weights, natural activations) excludes "
                             "pair-order activations")
        if self.epilogue == "swiglu" and self.n % 32 != 0:
            raise ValueError("swiglu needs N % 32 == 0")
        if self.n_out % self.rows_out != 0:
            raise ValueError(f"N_out={self.n_out} must be a multiple of {self.rows_out}")
        if self.kc % 256 != 0 or self.k % self.kc != 0:
            raise ValueError(f"K={self.k} must be a multiple of the chunk {self.kc}, itself a "
                             "multiple of 256 (16-byte scale copies)")
        if self.rows_phys > 64:
            raise ValueError("at most 64 weight rows per CTA")
        if not 2 <= self.stages <= 8:
            raise ValueError(f"stages must be in [2, 8], got {self.stages}")
        if not 1 <= self.warps_k <= 8:
            raise ValueError(f"warps_k must be in [1, 8], got {self.warps_k}")
        if self.overlap not in ("none", "after"):
            raise ValueError(f"overlap must be 'none' or 'after', got {self.overlap!r}")
        if self.pdl and not self.grouped:
            raise ValueError("launch overlap is for grouped problems only")
        if self.ctas < 0:
            raise ValueError(f"ctas must be >= 0, got {self.ctas}")
        if self.mx and not (self.grouped and self.permuted and self.kc % 512 == 0):
            raise ValueError("mx (UE8M0 scales per 32 k) is for grouped pair-order problems with "
                             "chunks of 512 k or more (16-byte scale copies)")
        if self.smem_bytes > _SMEM_LIMIT:
            raise ValueError(f"{self.smem_bytes} bytes of shared memory > {_SMEM_LIMIT}")

    @property
    def kc(self) -> int:
        """K values per pipeline stage."""
        return 128 * self.warps_k * self.steps

    @property
    def rows_out(self) -> int:
        """Output features per CTA: one MMA row set of 16 weight rows (per half for SwiGLU).
        Two sets per CTA, which halve the activation loads per weight, were slower at every
        size (``DESIGN.md``, section 3)."""
        return SET_ROWS

    @property
    def rows_phys(self) -> int:
        """Weight rows streamed per CTA (gate + up rows for SwiGLU)."""
        return self.rows_out * (2 if self.epilogue == "swiglu" else 1)

    @property
    def w_stride(self) -> int:
        """Bytes between two weight rows' codes in a stage (``tma2d``: inside a 64-byte
        column group)."""
        if self.tma2d:
            return 64
        wb = self.kc // 2
        return wb + (64 if wb % 128 == 0 else 0)

    @property
    def s_stride(self) -> int:
        """Bytes between two weight rows' scales in a stage (``tma2d``: inside a 16-byte
        column group)."""
        return 16 if self.tma2d else _odd16(self.kc // self.scale_k)

    @property
    def step_w_bytes(self) -> int:
        """Bytes between a row's codes of two consecutive 128-k steps in a stage (``tma2d``:
        one 64-byte column group of a 16-row box)."""
        return 64 * SET_ROWS if self.tma2d else 64

    @property
    def set_w_bytes(self) -> int:
        """Bytes between two 16-row sets' codes in a stage (``tma2d``: one box)."""
        return SET_ROWS * (self.kc // 2 if self.tma2d else self.w_stride)

    @property
    def set_s_bytes(self) -> int:
        """Bytes between two 16-row sets' scales in a stage (``tma2d``: one box)."""
        return SET_ROWS * (self.kc // self.scale_k if self.tma2d else self.s_stride)

    @property
    def scales_at(self) -> int:
        """Offset of a stage's scales (after every row's codes)."""
        return self.rows_phys // SET_ROWS * self.set_w_bytes

    @property
    def scale_group_steps(self) -> int:
        """``tma2d``: consumer steps whose block scales share one 16-byte column group of a
        row (2 e4m3 pairs of 8 bytes, or 4 UE8M0 words of 4 bytes)."""
        return 16 * self.scale_k // 128

    @property
    def stage_bytes(self) -> int:
        raw = self.scales_at + self.rows_phys // SET_ROWS * self.set_s_bytes
        return -(-raw // 128) * 128

    @property
    def red_len(self) -> int:
        acc_len = 4 * (self.block_m // 8) * (self.rows_phys // SET_ROWS)
        return max(1, (self.warps_k - 1) * 32 * acc_len)

    @property
    def smem_bytes(self) -> int:
        return _BAR_BYTES + self.stages * self.stage_bytes + 4 * self.red_len + 128

    @property
    def name(self) -> str:
        return (
            f"{self.name_head}"
            f"_wk{self.warps_k}_u{self.steps}_st{self.stages}"
            f"{f'_p{self.ctas}' if self.ctas else ''}{'_kp' if self.permuted else ''}"
            f"{'_pdl' if self.pdl else ''}{self.order_tag}{'_t2' if self.tma2d else ''}"
            f"{'_mx' if self.mx else ''}_{self.arch}"
        )


def supported(n_out: int, k: int) -> bool:
    """Whether some config covers this problem (N_out % 16, K % 256)."""
    return n_out % 16 == 0 and k % 256 == 0


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------


class W4A16StreamGemm(DirectLaunch):
    """The CuTeDSL kernel for one :class:`StreamConfig`; see the module docstring."""

    def __init__(self, cfg: StreamConfig) -> None:
        self.cfg = cfg
        self.num_tiles = cfg.block_m // 8
        self.num_row_sets = cfg.rows_phys // SET_ROWS
        self.frags = 2  # 16-byte fragments per row set and lane (rows g and g + 8)
        self.acc_len = 4 * self.num_tiles * self.num_row_sets
        self.chunks = cfg.k // cfg.kc
        self.tx_bytes = cfg.rows_phys * (cfg.kc // 2 + cfg.kc // cfg.scale_k)
        self.pipe_bytes = _BAR_BYTES + cfg.stages * cfg.stage_bytes
        # launch geometry for DirectLaunch.__call__ (consumer warps + the producer warp)
        self.features_per_cta = cfg.rows_out
        self.threads = 32 * (cfg.warps_k + 1)
        self.launch_smem = cfg.smem_bytes

    def grid(self, grid_n, grid_m):
        """One CTA per (feature tile, token tile), or at most ``ctas`` persistent CTAs."""
        if const_expr(self.cfg.ctas == 0):
            return [grid_n, grid_m, 1]
        return [cutlass.min(grid_n * grid_m, self.cfg.ctas), 1, 1]

    def make_kernel(self, a, w, w_scale, w_global, out, tile_expert, tile_rows, row_scale,
                    bias, swiglu_limit):
        """:class:`DirectLaunch`'s kernel, or with ``tma2d`` the TMA descriptors of the codes
        and the scales (column-group views, :meth:`tma_atoms`) and :meth:`kernel_t2` on them
        (plain Python, inlined while tracing)."""
        if const_expr(self.cfg.tma2d):
            tma_w, m_w, tma_s, m_s = self.tma_atoms(w, w_scale)
            return self.kernel_t2(a, tma_w, m_w, tma_s, m_s, w_global, out, tile_expert,
                                  tile_rows, row_scale, bias, swiglu_limit)
        return self.kernel(a, w, w_scale, w_global, out, tile_expert, tile_rows, row_scale,
                           bias, swiglu_limit)

    def tma_atoms(self, w, w_scale):
        """``tma2d``: TMA atoms over ``w`` ``[G, N, K/2]`` viewed as ``(64 bytes, G*N rows,
        K/128 column groups)`` and ``w_scale`` ``[G, N, K/scale_k]`` as ``(16 bytes, G*N,
        K/(16 scale_k))`` (dense: ``G = 1``), with boxes of one 16-row set and one stage:
        ``(64, 16, kc/128)`` codes and ``(16, 16, kc/(16 scale_k))`` scales, landing column
        group by column group (plain Python, inlined while tracing)."""
        cfg = self.cfg
        r = SET_ROWS
        rows = cfg.n
        if const_expr(cfg.grouped):
            rows = w.shape[0] * cfg.n
        sg = 16 * cfg.scale_k  # k values per 16-byte scale group
        w3 = cute.make_tensor(w.iterator, cute.make_layout(
            (64, rows, cfg.k // 128), stride=(1, cfg.k // 2, 64)))
        s3 = cute.make_tensor(w_scale.iterator, cute.make_layout(
            (16, rows, cfg.k // sg), stride=(1, cfg.k // cfg.scale_k, 16)))
        box_w = (64, r, cfg.kc // 128)
        box_s = (16, r, cfg.kc // sg)
        tma_w, m_w = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), w3,
            cute.make_layout(box_w, stride=(1, 64, 64 * r)), box_w)
        tma_s, m_s = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), s3,
            cute.make_layout(box_s, stride=(1, 16, 16 * r)), box_s)
        return tma_w, m_w, tma_s, m_s

    def cta_state(self):
        """What both kernels start with (plain Python, inlined while tracing): ``(tidx, bidx,
        bidy, pipe, sbase, red, acc)``: the pipeline's shared memory (barriers, then the
        stages) as a pointer and its 32-bit address, the split-K reduction buffer and the fp32
        accumulators."""
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        pipe = smem.allocate(self.pipe_bytes, 128)
        red = smem.allocate_tensor(Float32, cute.make_layout(self.cfg.red_len), 16)
        sbase = pipe.toint()
        acc = cute.make_rmem_tensor(cute.make_layout(self.acc_len), Float32)
        return tidx, bidx, bidy, pipe, sbase, red, acc

    @cute.kernel
    def kernel_t2(
        self,
        a: cute.Tensor,
        tma_w: cute.CopyAtom,
        m_w: cute.Tensor,
        tma_s: cute.CopyAtom,
        m_s: cute.Tensor,
        w_global: cute.Tensor,
        out: cute.Tensor,
        tile_expert: cute.Tensor,
        tile_rows: cute.Tensor,
        row_scale: cute.Tensor,
        bias: cute.Tensor,
        swiglu_limit: Float32,
    ):
        """:meth:`kernel` for ``tma2d`` configs: the producer gets the TMA atoms and views in
        place of ``w`` / ``w_scale``."""
        tidx, bidx, bidy, pipe, sbase, red, acc = self.cta_state()
        io = (a, m_w, m_s, w_global, out, tile_rows, row_scale, bias, swiglu_limit, red, acc,
              (tma_w, tma_s, pipe))
        self.cta_items(io, tile_expert, tidx, bidx, bidy, sbase)

    @cute.kernel
    def kernel(
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
        swiglu_limit: Float32,
    ):
        tidx, bidx, bidy, _, sbase, red, acc = self.cta_state()
        io = (a, w, w_scale, w_global, out, tile_rows, row_scale, bias, swiglu_limit, red, acc)
        self.cta_items(io, tile_expert, tidx, bidx, bidy, sbase)

    @cute.jit
    def cta_items(self, io, tile_expert, tidx, bidx, bidy, sbase):
        """This CTA's work: its one item (skipped when its token tile has no expert), or with
        ``ctas`` the items ``bidx, bidx + gridDim.x, ...`` through one pipeline."""
        cfg = self.cfg
        num_rows = io[0].shape[0]
        if const_expr(cfg.ctas == 0):
            expert = Int32(0)
            if const_expr(cfg.grouped):
                expert = tile_expert[bidy]
            if expert >= 0:
                self.init_barriers(tidx, sbase)
                self.item(io, tidx, sbase, bidx, bidy, expert, 0)
                self.finish(tidx, sbase)
            elif const_expr(cfg.pdl):
                # this kernel must not complete before the previous one ("Launch overlap")
                if bidx + bidy == 0:
                    cute.arch.griddepcontrol_wait()
        else:
            # persistent: work item i = (feature tile i % n_tiles, token tile i // n_tiles);
            # every role walks the same items, so both count the same pipeline chunks
            self.init_barriers(tidx, sbase)
            n_tiles = cfg.n_out // cfg.rows_out
            n_items = n_tiles * ((num_rows + (cfg.block_m - 1)) // cfg.block_m)
            gdim, _, _ = cute.arch.grid_dim()
            done = Int32(0)  # pipeline chunks this CTA has gone through
            for i in cutlass.range(bidx, n_items, gdim, unroll=1):
                ty = i // n_tiles
                expert = Int32(0)
                if const_expr(cfg.grouped):
                    expert = tile_expert[ty]
                if expert >= 0:
                    self.item(io, tidx, sbase, i - ty * n_tiles, ty, expert, done)
                    done = done + self.chunks
            if const_expr(cfg.pdl):
                if bidx == 0:  # as above, for a CTA that got no real item
                    cute.arch.griddepcontrol_wait()
            self.finish(tidx, sbase)

    @cute.jit
    def init_barriers(self, tidx, sbase):
        if tidx == 0:
            for s in cutlass.range_constexpr(self.cfg.stages):
                mbar_init(sbase + 8 * s, 1)
                mbar_init(sbase + 64 + 8 * s, 32 * self.cfg.warps_k)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

    @cute.jit
    def finish(self, tidx, sbase):
        """All roles done: invalidate the mbarriers (their memory may be reused next)."""
        cute.arch.sync_threads()
        if tidx == 0:
            for s in cutlass.range_constexpr(self.cfg.stages):
                mbar_inval(sbase + 8 * s)
                mbar_inval(sbase + 64 + 8 * s)

    @cute.jit
    def item(self, io, tidx, sbase, tile_n, tile_m, expert, done):
        """One work item: feature tile ``tile_n`` x token tile ``tile_m`` of group ``expert``
        (grouped: its first ``tile_rows[tile_m]`` rows are real tokens, module docstring,
        "Padding rows"); its K chunks are pipeline chunks ``done .. done + chunks - 1`` of this
        CTA."""
        cfg = self.cfg
        a, w, w_scale, w_global, out, tile_rows, row_scale, bias, swiglu_limit, red, acc = io[:11]
        warp = tidx // 32
        lane = tidx % 32
        num_rows = a.shape[0]
        stage0 = sbase + _BAR_BYTES
        row0 = tile_n * cfg.rows_out
        m0 = tile_m * cfg.block_m
        if warp == cfg.warps_k:
            if const_expr(cfg.tma2d):
                self.producer_t2(io[11], w, w_scale, expert, tile_n, lane, sbase, done)
            else:
                self.producer(w, w_scale, expert, row0, lane, sbase, stage0, done)
        else:
            if const_expr(cfg.pdl):
                # the activations, tile_rows and row scales come from earlier kernels
                cute.arch.griddepcontrol_wait()
                if tidx == 0:
                    cute.arch.griddepcontrol_launch_dependents()
            real = Int32(cfg.block_m)
            if const_expr(cfg.grouped):
                real = tile_rows[tile_m]
            acc.fill(0.0)
            self.consumer(acc, a, m0, real, warp, lane, num_rows, sbase, stage0, done)
            # deterministic split-K: consumers w > 0 park partial sums, w == 0 adds them in
            # order (named barrier: the producer warp does not wait, it streams the next item)
            if const_expr(cfg.warps_k > 1):
                if warp > 0:
                    slot = (warp - 1) * 32 + lane
                    for j in cutlass.range_constexpr(self.acc_len):
                        red[j * (cfg.warps_k - 1) * 32 + slot] = acc[j]
                cute.arch.barrier(barrier_id=1, number_of_threads=32 * cfg.warps_k)
                if warp == 0:
                    for q in cutlass.range_constexpr(cfg.warps_k - 1):
                        slot = q * 32 + lane
                        for j in cutlass.range_constexpr(self.acc_len):
                            acc[j] = acc[j] + red[j * (cfg.warps_k - 1) * 32 + slot]
                if const_expr(cfg.ctas > 0):
                    # the next item's partial sums must not overwrite these before they are read
                    cute.arch.barrier(barrier_id=1, number_of_threads=32 * cfg.warps_k)
            if warp == 0:
                self.epilogue(acc, out, w_global, row_scale, bias, swiglu_limit, expert, row0,
                              m0, lane // 4, lane % 4, num_rows)

    @cute.jit
    def producer(self, w, w_scale, expert, row0, lane, sbase, stage0, done):
        """Lane r streams weight row r of the CTA (rows r and r + 32 when there are 64); K chunk
        ``c`` is pipeline chunk ``done + c`` (stage and phase)."""
        cfg = self.cfg
        n_static = cfg.n
        k_static = cfg.k
        kc = cfg.kc
        ks = cfg.scale_k
        w_base = w.iterator.toint() + Int64(expert) * Int64(n_static * (k_static // 2))
        s_base = w_scale.iterator.toint() + Int64(expert) * Int64(n_static * (k_static // ks))
        rows_half = cfg.rows_out
        n_lanes_rows = (cfg.rows_phys + 31) // 32
        srcs_w = []
        srcs_s = []
        dsts_w = []
        dsts_s = []
        for j in cutlass.range_constexpr(n_lanes_rows):
            r = lane + 32 * j
            # physical row r: gate (or only) rows first, then the matching up rows
            grow = row0 + r
            if const_expr(cfg.epilogue == "swiglu"):
                grow = row0 + r % rows_half + (r // rows_half) * (n_static // 2)
            srcs_w.append(w_base + Int64(grow) * Int64(k_static // 2))
            srcs_s.append(s_base + Int64(grow) * Int64(k_static // ks))
            dsts_w.append(stage0 + r * cfg.w_stride)
            dsts_s.append(stage0 + cfg.scales_at + r * cfg.s_stride)
        for c in cutlass.range(self.chunks, unroll=1):
            s, full = self.acquire_stage(done + c, lane, sbase)
            off = s * cfg.stage_bytes
            for j in cutlass.range_constexpr(n_lanes_rows):
                if lane + 32 * j < cfg.rows_phys:
                    bulk_g2s(dsts_w[j] + off, srcs_w[j] + Int64(c * (kc // 2)), kc // 2, full)
                    bulk_g2s(dsts_s[j] + off, srcs_s[j] + Int64(c * (kc // ks)), kc // ks,
                              full)

    @cute.jit
    def acquire_stage(self, g, lane, sbase):
        """``(s, full)``: the producer's stage and *full* barrier address for its ``g``-th
        chunk: once the ring has wrapped, wait until the consumers freed stage ``s`` (its
        *empty* barrier), then lane 0 arms *full* with the stage's bytes."""
        cfg = self.cfg
        s = g % cfg.stages
        if g >= cfg.stages:
            mbar_wait(sbase + 64 + 8 * s, ((g // cfg.stages) + 1) % 2)
        full = sbase + 8 * s
        if lane == 0:
            mbar_arrive_expect_tx(full, self.tx_bytes)
        return s, full

    @cute.jit
    def producer_t2(self, tma, m_w, m_s, expert, tile_n, lane, sbase, done):
        """``tma2d``: the warp fills stage ``s`` of K chunk ``c`` (pipeline chunk ``done +
        c``) with one TMA copy per operand and 16-row set: codes boxes ``(64, 16, kc/128)``
        from the stage's start, then scales boxes ``(16, 16, kc/(16 scale_k))``, on the
        stage's *full* mbarrier. Set ``b``'s box starts at weight row ``expert * N + row0 +
        b * N/2`` (SwiGLU's up rows for ``b = 1``), a multiple of 16."""
        cfg = self.cfg
        tma_w, tma_s, pipe = tma
        r = SET_ROWS
        sets = cfg.rows_phys // SET_ROWS
        sg = cfg.kc // (16 * cfg.scale_k)  # 16-byte scale groups per row and chunk
        codes = cute.make_tensor(pipe + _BAR_BYTES, cute.make_layout(
            (64, r, cfg.kc // 128, sets, cfg.stages),
            stride=(1, 64, cfg.step_w_bytes, cfg.set_w_bytes, cfg.stage_bytes)))
        scales = cute.make_tensor(pipe + (_BAR_BYTES + cfg.scales_at), cute.make_layout(
            (16, r, sg, sets, cfg.stages),
            stride=(1, 16, 16 * r, cfg.set_s_bytes, cfg.stage_bytes)))
        g_w = cute.local_tile(m_w, (64, r, cfg.kc // 128), (0, None, None))
        g_s = cute.local_tile(m_s, (16, r, sg), (0, None, None))
        t_sw, t_gw = cpasync.tma_partition(tma_w, 0, cute.make_layout(1),
                                           cute.group_modes(codes, 0, 3),
                                           cute.group_modes(g_w, 0, 3))
        t_ss, t_gs = cpasync.tma_partition(tma_s, 0, cute.make_layout(1),
                                           cute.group_modes(scales, 0, 3),
                                           cute.group_modes(g_s, 0, 3))
        # the box row (in 16-row units) of each set
        box_rows = []
        for b in cutlass.range_constexpr(sets):
            box_row = tile_n + b * (cfg.n // (2 * r))
            if const_expr(cfg.grouped):
                box_row = box_row + expert * (cfg.n // r)
            box_rows.append(box_row)
        # the whole warp runs the loop: a TMA copy elects its issuing lane (elect.sync over the
        # full warp, which a lone lane 0 must not execute)
        for c in cutlass.range(self.chunks, unroll=1):
            s, full = self.acquire_stage(done + c, lane, sbase)
            bar = cute.make_ptr(Int64, full, cute.AddressSpace.smem, assumed_align=8)
            for b in cutlass.range_constexpr(sets):
                cute.copy(tma_w, t_gw[(None, box_rows[b], c)], t_sw[(None, b, s)],
                          tma_bar_ptr=bar)
            for b in cutlass.range_constexpr(sets):
                cute.copy(tma_s, t_gs[(None, box_rows[b], c)], t_ss[(None, b, s)],
                          tma_bar_ptr=bar)

    @cute.jit
    def consumer(self, acc, a, m0, real, warp, lane, num_rows, sbase, stage0, done):
        cfg = self.cfg
        k_static = cfg.k
        grp = lane // 4
        quad = lane % 4
        nq = self.num_row_sets
        # this lane's bytes of weight row g (row set 0), its warp's first step of a chunk, and
        # the static offsets of its later steps (wcol, scol) and of its other rows (w_off,
        # s_off: row sets q, rows g and g + 8), in the stage layout of the config's properties
        lane_w = stage0 + grp * cfg.w_stride + quad * 16 + warp * cfg.step_w_bytes
        wcol = [cfg.warps_k * u * cfg.step_w_bytes for u in range(cfg.steps)]
        w_off = []
        s_off = []
        for q in cutlass.range_constexpr(nq):
            for h in cutlass.range_constexpr(self.frags):
                w_off.append(q * cfg.set_w_bytes + 8 * h * cfg.w_stride)
                s_off.append(q * cfg.set_s_bytes + 8 * h * cfg.s_stride)
        # scale bytes per 128-k step: 8 e4m3 (the lane's 32 k: two), or 4 UE8M0 (one)
        sb = 128 // cfg.scale_k
        lane_s = stage0 + cfg.scales_at + grp * cfg.s_stride + quad * (sb // 4)
        s_delta = None  # run-time scale offsets of each step (tma2d, warps sharing groups)
        if const_expr(not cfg.tma2d):
            lane_s = lane_s + warp * sb
            scol = [sb * cfg.warps_k * u for u in range(cfg.steps)]
        else:
            # a 16-byte scale group of a row holds `spg` consecutive steps
            spg = cfg.scale_group_steps
            sg_bytes = 16 * SET_ROWS
            if const_expr(cfg.warps_k % spg == 0):
                lane_s = lane_s + (warp // spg) * sg_bytes + (warp % spg) * sb
                scol = [cfg.warps_k * u // spg * sg_bytes for u in range(cfg.steps)]
            else:
                # a step round's warps share groups: each step's offset, once, at run time
                s_delta = []
                for u in cutlass.range_constexpr(cfg.steps):
                    j = warp + cfg.warps_k * u
                    s_delta.append((j // spg) * sg_bytes + (j % spg) * sb)
                scol = [0 for u in range(cfg.steps)]
        a_base = a.iterator.toint()
        a_row_addr = []
        for t in cutlass.range_constexpr(self.num_tiles):
            # padding rows read the tile's last real row: same addresses, one L1 wavefront
            token = cutlass.min(m0 + cutlass.min(t * 8 + grp, cutlass.max(real - 1, 0)),
                                num_rows - 1)
            a_row_addr.append(a_base + Int64(token) * Int64(k_static * 2)
                              + Int64(quad * 64 + warp * 256))
        for c in cutlass.range(self.chunks, unroll=1):
            g = done + c
            s = g % cfg.stages
            mbar_wait(sbase + 8 * s, (g // cfg.stages) % 2)
            off = s * cfg.stage_bytes
            lw = lane_w + off
            ls = lane_s + off
            for u in cutlass.range_constexpr(cfg.steps):
                kb = c * cfg.kc + 128 * cfg.warps_k * u  # + 128 * warp (in a_row_addr)
                ls_u = ls
                if const_expr(s_delta is not None):
                    ls_u = ls + s_delta[u]
                self.mma_step(acc, lw, ls_u, w_off, s_off, wcol[u], scol[u], a_row_addr, kb)
            # order this warp's shared-memory reads (generic proxy) before the bulk copy
            # (async proxy) that will overwrite the stage once the producer sees the arrive
            fence_proxy_async()
            mbar_arrive(sbase + 64 + 8 * s)

    def mma_step(self, acc, lw, ls, w_off, s_off, wcol: int, scol: int, a_row_addr, kb):
        """One 128-k step: fragments from shared memory, decode, MMA against the activations.

        Plain Python (inlined while tracing); ``wcol``/``scol`` are static byte offsets.
        """
        nq = self.num_row_sets
        nr = self.frags * nq
        wv = []
        scl = []
        for q2 in range(nr):
            wv.append(ld_shared_v4_at(lw, w_off[q2] + wcol))
            if const_expr(self.cfg.mx):
                # one UE8M0 scale for the lane's 32 k: both 16-k halves (r // 2 below)
                v = mx_scale_pre(lds_u8(ls, s_off[q2] + scol))
                scl.append((v, v))
            else:
                scl.append(scales_to_bf16x2_pre(lds_u16(ls, s_off[q2] + scol)))
        x_addr = []
        for t in range(self.num_tiles):
            x_addr.append(a_row_addr[t] + Int64(kb * 2))
        # round r: checkpoint order decodes word r (register j = codes (j, j + 4) of its 8 k,
        # block scale r // 2) and pairs the r-th 16-byte activation load to match (``prmt``, or
        # nothing with pair-order activations). ``wfrag`` takes register r of all four words
        # (word i: natural k pair 8r + 2i + {0, 1} of the 32-k block, block scale r // 2): the
        # MMAs take words (0, 1) and (2, 3) as their two k slots against the natural load r.
        if const_expr(self.cfg.order.fragment_order):
            decode_reg = decode_reg_wperm if self.cfg.order.wperm_bits else decode_reg_pair4
        else:
            decode = decode_word_wperm if self.cfg.order.wperm_bits else decode_word_pair4
        for r in range(4):
            dec = []
            for q2 in range(nr):
                if const_expr(self.cfg.order.fragment_order):
                    dec.append([decode_reg(wv[q2][i], r, scl[q2][r // 2]) for i in range(4)])
                else:
                    dec.append(decode(wv[q2][r], scl[q2][r // 2]))
            for t in range(self.num_tiles):
                xv = ld_v4_at(x_addr[t], r * 16)
                if self.cfg.order.fragment_order or self.cfg.permuted:
                    # wfrag: natural pairs; pair order: word j holds k (p+j, p+j+4) already
                    b0, b1, b2, b3 = xv[0], xv[1], xv[2], xv[3]
                else:
                    b0, b1 = pair_halves(xv[0], xv[2])  # k pairs (p, p+4), (p+1, p+5)
                    b2, b3 = pair_halves(xv[1], xv[3])  # (p+2, p+6), (p+3, p+7)
                for q in range(nq):
                    dg = dec[2 * q]
                    d8 = dec[2 * q + 1]
                    base = 4 * (q * self.num_tiles + t)
                    mma_m16n8k16(acc, base, dg[0], d8[0], dg[1], d8[1], b0, b1)
                    mma_m16n8k16(acc, base, dg[2], d8[2], dg[3], d8[3], b2, b3)

    @cute.jit
    def epilogue(self, acc, out, w_global, row_scale, bias, swiglu_limit, expert, row0, m0,
                 grp, quad, num_rows):
        """C fragment f of column tile t: weight row g + 8 (f // 2), token 8 t + 2 c + (f % 2);
        the up half's fragments follow the gate half's. Pair order + ``swiglu``: feature ``row``
        is stored at column ``8 (row // 8) + pair_dst(row % 8)`` (``row % 8 == g``: ``row0``
        is a multiple of 8)."""
        cfg = self.cfg
        unscale = Float32(128.0)  # the pair4 decoder feeds the MMA e2m1 * scale * 2^-7
        col_shift = 0
        if const_expr(cfg.permuted and cfg.epilogue == "swiglu"):
            # pair_dst(g) - g = 2 (g % 4) + g // 4 - g, the same for every row of this lane
            col_shift = 2 * (grp % 4) + grp // 4 - grp
        for t in cutlass.range_constexpr(self.num_tiles):
            for f in cutlass.range_constexpr(2 * self.frags):
                token = m0 + t * 8 + quad * 2 + (f % 2)
                row = row0 + grp + 8 * (f // 2)
                if token < num_rows:
                    v = epilogue_value(cfg, acc, 4 * t + f, 4 * (self.num_tiles + t) + f,
                                       unscale, w_global, expert, row, token, row_scale, bias,
                                       swiglu_limit)
                    if const_expr(cfg.permuted and cfg.epilogue == "swiglu"):
                        out[token, row + col_shift] = v.to(BFloat16)
                    else:
                        out[token, row] = v.to(BFloat16)


def compile_gemm(cfg: StreamConfig, extra_options: str = ""):
    """Compile ``cfg`` for sm_90a from fake tensors, no GPU needed (the tvm-ffi callable of
    :func:`nvfp4_ops.kernels.cute.gemm_interface.compile_from_fakes`)."""
    return compile_from_fakes(W4A16StreamGemm(cfg), cfg, scale_align=16,
                              extra_options=extra_options)
