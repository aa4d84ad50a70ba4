"""Exact W4A16 NVFP4 grouped GEMM for Hopper (sm_90a), written in CuTeDSL.

``out[p, n] = epilogue(sum_k a[p, k] * e2m1[g, n, k] * block_scale[g, n, k//16] * global[g, n])``
for every token row ``p`` of an m-tile whose group (expert) is ``g``.

Interface (shared by every kernel family; the torch-side launcher is
:func:`nvfp4_ops.kernels.linear_cuda.run_gemm`, this module only holds the CuTeDSL kernel and
its compile-time configuration):

* ``a``: bf16 ``[P, K]`` contiguous, rows grouped by expert; ``P`` is symbolic (one binary
  serves every token count).
* ``tile_expert``: int32 ``[ceil(P / block_m)]``: local expert of each m-tile, ``-1`` = skip
  (rows of a skipped tile are never written). Linear / MLP pass a one-element dummy and compile
  with ``grouped=False`` (every tile is group 0).
* ``tile_rows``: int32 ``[ceil(P / block_m)]``: grouped only, how many leading rows of each
  m-tile hold real tokens (the MoE routing's padding fills the rest; at least 1 in a tile that
  is not skipped). The rows past it are padding whose outputs nobody reads, so a kernel may
  compute them from any input row: the streamed kernel (``w4a16_stream``) points their
  activation loads at the last real row, which saves L1 traffic when tiles are mostly padding
  (decode). The other families ignore it. A one-element dummy for linear / MLP.
* ``w`` uint8 ``[G, N, K/2]`` (checkpoint layout, low nibble = even k), ``w_scale`` e4m3 viewed
  as uint8 ``[G, N, K/16]`` (row-major, as in checkpoints), ``w_global`` fp32 ``[G, H2, N/H2]``
  with any strides (0 allowed): ``global[g, n] = w_global[g, n // (N/H2), n % (N/H2)]``,
  ``H2 = 2`` for ``swiglu`` (gate half, up half), else 1 (see
  :mod:`nvfp4_ops.kernels.cute.gemm_interface`).
* ``out`` bf16 ``[P, N_out]``; ``N_out = N/2`` for ``swiglu`` (gate rows ``[0, N/2)``, up rows
  ``[N/2, N)``), else ``N``.
* ``row_scale`` fp32 ``[P]`` (``row_scale`` epilogue), ``bias`` bf16 ``[N]`` (``none``
  epilogue), ``counters`` int32 / ``scratch`` fp32 (the stream-K workspace of ``w4a16_wgmma``),
  each a one-element dummy when unused; ``swiglu_limit`` fp32 scalar (``inf`` = none).

The math (exact up to fp32 summation order)
-------------------------------------------
Weights are the MMA's A operand (rows = output features, the M side of ``mma.sync.m16n8k16``)
and tokens are the B operand (the N side, 8 tokens per MMA), so a decode batch of 1-16 tokens
costs 1-2 MMA columns instead of a 64-row tile.

FP4 decode happens in registers (the ``shift`` decoder): for the pair of codes in byte j of a
u32 word, one ``prmt`` puts the even code in bits 12-15 and the odd code in bits 28-31; the
sign bits stay, the 3 magnitude bits move right by 6 into the low exponent bits + top mantissa
bit, giving exactly ``e2m1 * 2^-126`` per bf16 (0.5 is a bf16 subnormal); one bf16x2 multiply
by ``block_scale * 2^119`` (exact in bf16) yields ``e2m1 * block_scale * 2^-7``, and the
epilogue scales the fp32 accumulator by 2^7 (exact). About 5 instructions per pair, which
matters: the decode kernels are limited by the instructions their warps issue.
e2m1 (2 significant bits) times e4m3 (4 significant bits) fits bf16's 8-bit significand, so
the MMA sees exactly ``e2m1 * block_scale`` (times a power of two). The MMA accumulates in fp32;
the per-row global scale (and bias, SwiGLU, router weight) is applied to the fp32 accumulator in
the epilogue, and the result is rounded to bf16 once.

No weight re-layout: the checkpoint bytes are consumed directly. A lane with ``lane % 4 == c``
loads 16 bytes of one weight row = physical k ``[kb + 32c, kb + 32c + 32)`` (one 128-bit load,
two block scales), and uses u32 word ``i`` (physical k ``32c + 8i .. 32c + 8i + 7``) for two
MMA k-steps: step ``s`` feeds physical k ``32c + 8i + 4s + {0,1,2,3}`` as the MMA's logical k
``{2c, 2c+1, 2c+8, 2c+9}``. The activation B-fragment is loaded with the same permutation, which
makes it one 16-byte load per (token, lane, word): ``a[token, kb + 32c + 8i : +8]``. Only the
order of the k reduction changes, not the math.

Parallelism: a CTA has ``warps_n * warps_k`` warps. Each warp owns 16 weight rows (32 for
SwiGLU: the gate rows and the matching up rows) and ``block_m`` tokens, over one of ``warps_k``
K-slices; K-slices are summed through shared memory in a fixed order (deterministic split-K, no
atomics). Grid = ``(N_out / rows_per_cta, ceil(P / block_m))``.

Weights stream through a per-lane register ring of :data:`STAGES` 128-k steps with static
slots (the k loop is unrolled by it; no register copies), 16-byte loads at static offsets
from one 64-bit base per lane.

Role in the dispatch (:mod:`nvfp4_ops.kernels.dispatch`): dense tiles of 16-32 tokens and the
fallback for every shape the other families do not cover; it covers every ``N_out % 16``,
``K % 128`` problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, const_expr

from nvfp4_ops.kernels.cute.fp4_ptx import (
    decode_reg_pair4,
    decode_reg_wperm,
    decode_word_shift,
    ld_u16_at,
    ld_v4_at,
    mma_m16n8k16,
    scales_to_bf16x2_pre,
)
from nvfp4_ops.kernels.cute.gemm_interface import (
    EPILOGUES,
    DirectLaunch,
    GemmProblem,
    compile_from_fakes,
    epilogue_value,
)
from nvfp4_ops.orders import WeightOrder

__all__ = ["EPILOGUES", "BLOCK_MS", "GemmConfig", "W4A16GroupedGemm", "compile_gemm",
           "supported"]

#: token tile sizes (``block_m``) a binary can be compiled for; the MoE routing pads each
#: expert segment to a multiple of the one it uses.
BLOCK_MS = (8, 16, 32, 64)
#: 128-k steps in each lane's register ring: deeper rings (3, 4, 6) were slower, the loop is
#: issue / occupancy bound, not short of loads in flight (``DESIGN.md``, section 4)
STAGES = 2



@dataclass(frozen=True)
class GemmConfig(GemmProblem):
    """Everything that changes the generated code (and nothing else: P and G are symbolic).

    The problem fields of :class:`GemmProblem` (``block_m``: 8 x MMA columns), then
    ``warps_n``: warps along the weight rows, ``warps_k``: warps splitting K.
    """

    PREFIX: ClassVar[str] = "w4a16"
    BLOCK_MS: ClassVar[tuple[int, ...]] = BLOCK_MS

    warps_n: int = 1
    warps_k: int = 8
    row_groups: int = 1
    #: how the weight codes are stored: CHECKPOINT, or WFRAG (the fragment order of
    #: :mod:`nvfp4_ops.orders.wfrag`, natural activations: ``pair4`` registers, register ``j``
    #: of word ``i`` (block scale ``j // 2``) against element ``i`` of the block's ``j``-th
    #: activation load, with the ``wperm`` bits)
    order: WeightOrder = WeightOrder.CHECKPOINT
    arch: str = "sm_90a"

    def __post_init__(self) -> None:
        self.check_problem()
        if self.n_out % self.rows_per_cta != 0:
            raise ValueError(f"N_out={self.n_out} must be a multiple of {self.rows_per_cta}")
        if self.k % (128 * self.warps_k) != 0:
            raise ValueError(f"K={self.k} must be a multiple of {128 * self.warps_k}")
        if self.epilogue == "swiglu" and self.n % 32 != 0:
            raise ValueError("swiglu needs N % 32 == 0")
        if self.order is WeightOrder.WPERM:
            raise ValueError("the WPERM order is read by mma.sync only in the fragment order "
                             "(WFRAG): its checkpoint-order path has no pair4 decode")

    @property
    def rows_per_cta(self) -> int:
        """Output rows (features) per CTA: 16 per MMA row group, ``row_groups`` per warp."""
        return 16 * self.row_groups * self.warps_n

    @property
    def name(self) -> str:
        return (
            f"{self.name_head}_wn{self.warps_n}"
            f"_wk{self.warps_k}_rg{self.row_groups}"
            f"{self.order_tag}_{self.arch}"
        )


def supported(n_out: int, k: int) -> bool:
    """Whether some config covers this problem (else callers fall back to the reference)."""
    return n_out % 16 == 0 and k % 128 == 0


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------


class W4A16GroupedGemm(DirectLaunch):
    """The CuTeDSL kernel for one :class:`GemmConfig`; see the module docstring."""

    def __init__(self, cfg: GemmConfig) -> None:
        self.cfg = cfg
        self.num_tiles = cfg.block_m // 8  # MMA columns per warp
        self.num_halves = 2 if cfg.epilogue == "swiglu" else 1  # gate (+ up) row sets
        self.num_row_sets = self.num_halves * cfg.row_groups  # 16-row A operands per warp
        self.num_warps = cfg.warps_n * cfg.warps_k
        self.acc_len = 4 * self.num_tiles * self.num_row_sets
        self.k_iters = cfg.k // (128 * cfg.warps_k)
        self.red_len = max(1, (cfg.warps_k - 1) * cfg.warps_n * 32 * self.acc_len)
        self.smem_bytes = 4 * self.red_len + 64
        # launch geometry for DirectLaunch.__call__
        self.features_per_cta = cfg.rows_per_cta
        self.threads = 32 * self.num_warps
        self.launch_smem = self.smem_bytes

    @cute.kernel
    def kernel(
        self,
        a: cute.Tensor,
        w: cute.Tensor,
        w_scale: cute.Tensor,
        w_global: cute.Tensor,
        out: cute.Tensor,
        tile_expert: cute.Tensor,
        tile_rows: cute.Tensor,  # unused (see the module docstring)
        row_scale: cute.Tensor,
        bias: cute.Tensor,
        swiglu_limit: Float32,
    ):
        cfg = self.cfg
        n_static = cfg.n
        k_static = cfg.k
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        grp = lane // 4  # MMA groupID: weight row g / token column g
        quad = lane % 4  # MMA thread-in-group: which 32-k chunk of the 128-k step
        wn = warp % cfg.warps_n
        wk = warp // cfg.warps_n

        num_rows = a.shape[0]
        expert = Int32(0)
        if const_expr(cfg.grouped):
            expert = tile_expert[bidy]

        smem = cutlass.memory.SmemAllocator()
        red = smem.allocate_tensor(
            Float32, cute.make_layout(self.red_len), 16
        )

        if expert >= 0:
            m0 = bidy * cfg.block_m
            # first gate (or only) row of this warp; row set q = half * row_groups + j covers
            # rows row0 + 16 j (+ N/2 for the up half)
            row0 = bidx * cfg.rows_per_cta + wn * (16 * cfg.row_groups)
            nq = self.num_row_sets
            acc = cute.make_rmem_tensor(cute.make_layout(self.acc_len), Float32)
            acc.fill(0.0)

            w_base = w.iterator.toint() + Int64(expert) * Int64(n_static * (k_static // 2))
            s_base = w_scale.iterator.toint() + Int64(expert) * Int64(n_static * (k_static // 16))
            a_base = a.iterator.toint()
            # one 64-bit base per lane (row row0 + g, this lane's 32-k chunk); weight fragment
            # q2 = 2 q + h (row set q, rows +8 h) sits at a static byte offset from it
            w_lane = w_base + Int64(row0 + grp) * Int64(k_static // 2) + Int64(quad * 16)
            s_lane = s_base + Int64(row0 + grp) * Int64(k_static // 16) + Int64(quad * 2)
            w_off = []
            s_off = []
            for q in cutlass.range_constexpr(nq):
                half_off = (q // cfg.row_groups) * (n_static // 2)
                for h in cutlass.range_constexpr(2):
                    row_off = half_off + (q % cfg.row_groups) * 16 + h * 8
                    w_off.append(row_off * (k_static // 2))
                    s_off.append(row_off * (k_static // 16))
            # activation row address per MMA column tile (token clamped: never read past P)
            a_row_addr = []
            for t in cutlass.range_constexpr(self.num_tiles):
                token = cutlass.min(m0 + t * 8 + grp, num_rows - 1)
                a_row_addr.append(a_base + Int64(token) * Int64(k_static * 2) + Int64(quad * 64))

            # register ring of STAGES 128-k steps: while step `it` is decoded and multiplied,
            # the loads of steps it+1 .. it+STAGES-1 are in flight. Slots are static (the loop
            # is unrolled by STAGES): a dynamic register index would go to local memory.
            nr = 2 * nq
            ns = STAGES
            wbuf = cute.make_rmem_tensor(cute.make_layout(ns * nr * 4), Int32)
            sbuf = cute.make_rmem_tensor(cute.make_layout(ns * nr), Int32)
            k_first = wk * self.k_iters * 128
            last = self.k_iters - 1
            for j in cutlass.range_constexpr(ns - 1):
                self.load_step(wbuf, sbuf, j, w_lane, s_lane, w_off, s_off,
                               k_first + min(j, last) * 128)
            n_outer = (self.k_iters + ns - 1) // ns
            for o in cutlass.range(n_outer, unroll=1):
                for j in cutlass.range_constexpr(ns):
                    it = o * ns + j
                    nxt = cutlass.min(it + (ns - 1), last)
                    self.load_step(wbuf, sbuf, (j + ns - 1) % ns, w_lane, s_lane, w_off, s_off,
                                   k_first + nxt * 128)
                    if const_expr(self.k_iters % ns == 0):
                        self.mma_step(acc, wbuf, sbuf, j, a_row_addr, k_first + it * 128)
                    else:
                        if it < self.k_iters:
                            self.mma_step(acc, wbuf, sbuf, j, a_row_addr, k_first + it * 128)
            # deterministic split-K: warps wk > 0 park partial sums, wk == 0 adds them in order
            if const_expr(cfg.warps_k > 1):
                if wk > 0:
                    slot = ((wk - 1) * cfg.warps_n + wn) * 32 + lane
                    for j in cutlass.range_constexpr(self.acc_len):
                        red[j * (cfg.warps_k - 1) * cfg.warps_n * 32 + slot] = acc[j]
            cute.arch.sync_threads()
            if wk == 0:
                if const_expr(cfg.warps_k > 1):
                    for q in cutlass.range_constexpr(cfg.warps_k - 1):
                        slot = (q * cfg.warps_n + wn) * 32 + lane
                        for j in cutlass.range_constexpr(self.acc_len):
                            acc[j] = acc[j] + red[j * (cfg.warps_k - 1) * cfg.warps_n * 32 + slot]
                self.epilogue(acc, out, w_global, row_scale, bias, swiglu_limit, expert, row0,
                              m0, grp, quad, num_rows)

    def load_step(self, wbuf, sbuf, slot: int, w_lane, s_lane, w_off, s_off, kb):
        """Issue the loads of the 128-k step at ``kb`` into ring slot ``slot`` (static).

        Plain Python (no ``cute.jit``): it is inlined while the kernel is traced.
        """
        nr = 2 * self.num_row_sets
        wk_addr = w_lane + Int64(kb // 2)
        sk_addr = s_lane + Int64(kb // 16)
        for q2 in range(nr):
            v = ld_v4_at(wk_addr, w_off[q2])
            for e in range(4):
                wbuf[(slot * nr + q2) * 4 + e] = v[e]
            sbuf[slot * nr + q2] = ld_u16_at(sk_addr, s_off[q2])

    def mma_step(self, acc, wbuf, sbuf, slot: int, a_row_addr, kb):
        """Decode ring slot ``slot`` and multiply it with the activations of the step at ``kb``.

        Word i of a lane's 16-byte fragment holds physical k ``32c + 8i .. +7``; MMA step 0
        takes its codes 0-3, step 1 codes 4-7 (module docstring), B from the same k.
        """
        cfg = self.cfg
        nq = self.num_row_sets
        nr = 2 * nq
        scl = []
        for q2 in range(nr):
            scl.append(scales_to_bf16x2_pre(sbuf[slot * nr + q2]))
        x_addr = []
        for t in range(self.num_tiles):
            x_addr.append(a_row_addr[t] + Int64(kb * 2))
        # round r: checkpoint order decodes word r (register j = codes (j, j + 4) of its 8 k,
        # block scale r // 2); wfrag takes register r of all four words (word i: natural k pair
        # 8r + 2i + {0, 1}, block scale r // 2, as in w4a16_stream.mma_step). Either way
        # the round meets the block's r-th 16-byte activation load.
        if const_expr(cfg.order.fragment_order):
            decode_reg = decode_reg_wperm if cfg.order.wperm_bits else decode_reg_pair4
        else:
            decode_word = decode_word_shift
        for r in range(4):
            dec = []
            for q2 in range(nr):
                words = [wbuf[(slot * nr + q2) * 4 + i] for i in range(4)]
                if const_expr(cfg.order.fragment_order):
                    dec.append([decode_reg(words[i], r, scl[q2][r // 2]) for i in range(4)])
                else:
                    dec.append(decode_word(words[r], scl[q2][r // 2]))
            for t in range(self.num_tiles):
                xv = ld_v4_at(x_addr[t], r * 16)
                for q in range(nq):
                    dg = dec[2 * q]
                    d8 = dec[2 * q + 1]
                    base = 4 * (q * self.num_tiles + t)
                    mma_m16n8k16(acc, base, dg[0], d8[0], dg[1], d8[1], xv[0], xv[1])
                    mma_m16n8k16(acc, base, dg[2], d8[2], dg[3], d8[3], xv[2], xv[3])

    @cute.jit
    def epilogue(self, acc, out, w_global, row_scale, bias, swiglu_limit, expert, row0, m0,
                 grp, quad, num_rows):
        """C fragment j of column tile t: weight row g + 8 (j // 2), token 8t + 2c + (j % 2)."""
        cfg = self.cfg
        # the shift decoder feeds the MMA e2m1 * scale * 2^-7: scaling back by 2^7 is exact
        unscale = Float32(128.0)
        for j in cutlass.range_constexpr(cfg.row_groups):
            for t in cutlass.range_constexpr(self.num_tiles):
                for f in cutlass.range_constexpr(4):
                    token = m0 + t * 8 + quad * 2 + (f % 2)
                    row = row0 + 16 * j + grp + 8 * (f // 2)
                    if token < num_rows:
                        # the up rows are row groups row_groups + j
                        v = epilogue_value(cfg, acc, 4 * (j * self.num_tiles + t) + f,
                                           4 * ((cfg.row_groups + j) * self.num_tiles + t) + f,
                                           unscale, w_global, expert, row, token, row_scale,
                                           bias, swiglu_limit)
                        out[token, row] = v.to(BFloat16)


def compile_gemm(cfg: GemmConfig, extra_options: str = ""):
    """Compile ``cfg`` for sm_90a from fake tensors, no GPU needed (the tvm-ffi callable of
    :func:`nvfp4_ops.kernels.cute.gemm_interface.compile_from_fakes`)."""
    return compile_from_fakes(W4A16GroupedGemm(cfg), cfg, scale_align=2,
                              extra_options=extra_options)
