"""Stream-K for the dense WGMMA kernel (``WgmmaConfig.streamk``): the work split, the
fix-up of partial tiles, and the kernel's stream-K producer and consumers
(:class:`StreamKTiles`). CuTeDSL, inlined while a kernel is traced.

Why: a dense layer has few output tiles for the SMs. At M = 128, (18432, 7168) has 96 tiles of
three row warpgroups (36 of 132 SMs idle) or 144 of two (two waves); at 16 tokens,
(7168, 18432) has 112 one-warpgroup tiles. Splitting the K loop of every tile evenly over the
CTAs gives each SM the same work (``nvfp4_ops/kernels/DESIGN.md``, "Stream-K").

Work split. An output tile ("item": feature tile x token tile, item ``i`` = feature tile
``i % n_tiles``, token tile ``i // n_tiles``) needs ``U`` K units (ring stages of 128 k).
The ``units = items * U`` pairs (item, unit), item-major, are cut into ``G`` contiguous
ranges (``G`` = the grid): CTA ``b`` takes ``[floor(b units / G), floor((b + 1) units / G))``
(:func:`span`), item after item, with one pipeline that runs on across them.
Besides whole items, a CTA therefore holds a *piece* of at most two items that it does not
finish alone: its first (the item began in an earlier CTA) and its last (it goes on in later
ones).

Fix-up (deterministic, no waiting). Every piece of an unfinished item is parked in the
scratch, then counted in the item's counter (one acquire-release atomic by thread 0 between
two CTA barriers). The CTA
that brings the count to the number of pieces sums all of them, its own included, in CTA
order (= K order), writes the output and resets the counter to zero. No CTA waits for
another, so no co-residency is assumed, and the sum does not depend on arrival order. The
pieces of item ``i`` come from CTAs ``b_lo .. b_hi`` (:func:`item_owners`). CTA ``b`` parks a
piece in slot 1 of its two scratch slots when ``b == b_lo`` (the item begins in it, so it is
the CTA's last piece), else in slot 0 (its first piece); no two pieces share a slot.

Scratch: fp32 ``[G, 2, partial_len]`` (the host passes int32 words). Counters: int32, one per
item, zero on entry and on exit.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, Int64, const_expr
from cutlass.cute.arch import inline_ptx
from cutlass.cute.nvgpu import cpasync, warpgroup

from nvfp4_ops.kernels.cute.ptx import cp_async_ca8, cp_async_mbarrier_arrive

__all__ = ["StreamKTiles", "atom_add_acq_rel_u32", "item_owners", "park", "span",
           "st_global_u32", "sum_pieces"]


def atom_add_acq_rel_u32(addr: Int64, value: int):
    """``*addr += value`` on a global u32, acquire-release at GPU scope; returns the old value.
    After a CTA barrier, one thread's release publishes the stores of every thread before the
    barrier (release is cumulative), and its acquire, followed by a CTA barrier, makes the
    other CTAs' published stores visible to every thread: the pattern of CUTLASS's generic
    barrier (``arrive_inc`` / ``wait_eq``), without a fence per thread."""
    return inline_ptx(f"atom.acq_rel.gpu.global.add.u32 {{$w0}}, [{{$r0}}], {value};",
                      write_only_types=[Int32], read_only_args=[addr])


def st_global_u32(addr: Int64, value: Int32) -> None:
    inline_ptx("st.global.u32 [{$r0}], {$r1};", read_only_args=[addr, value])


def _st_global_f32(addr: Int64, offset: int, value: Float32) -> None:
    inline_ptx(f"st.global.f32 [{{$r0}}+{offset}], {{$r1}};", read_only_args=[addr, value])


def _ld_global_cg_f32(addr: Int64, offset: int):
    """4-byte global load cached in L2 only (data another SM wrote during this kernel)."""
    return inline_ptx(f"ld.global.cg.f32 {{$w0}}, [{{$r0}}+{offset}];",
                      write_only_types=[Float32], read_only_args=[addr])


def span(units: Int64, bidx, gdim):
    """``(start, end)``: CTA ``bidx``'s units, ``[floor(bidx units / gdim), floor((bidx + 1)
    units / gdim))`` (Int32; the products in Int64)."""
    start = Int32(Int64(bidx) * units // Int64(gdim))
    end = Int32(Int64(bidx + 1) * units // Int64(gdim))
    return start, end


def item_owners(item, per_item: int, units: Int64, gdim):
    """``(b_lo, b_hi)``: the CTAs holding the first and the last unit of ``item``. The owner of
    unit ``p`` is the ``b`` with ``floor(b U / G) <= p < floor((b + 1) U / G)``, i.e.
    ``ceil((p + 1) G / U) - 1``."""
    first = Int64(item) * Int64(per_item)
    b_lo = Int32(((first + 1) * Int64(gdim) + units - 1) // units - 1)
    b_hi = Int32(((first + per_item) * Int64(gdim) + units - 1) // units - 1)
    return b_lo, b_hi


@cute.jit
def park(acc, scratch_base: Int64, bidx, b_lo, partial_len: cutlass.Constexpr,
         thread_off, n_acc: cutlass.Constexpr, stride: cutlass.Constexpr):
    """Store ``acc[0 .. n_acc)`` of this thread into CTA ``bidx``'s slot for a piece (slot 1 if
    ``bidx == b_lo``, else 0): element ``j`` at ``thread_off + j * stride`` of the slot."""
    slot = Int32(0)
    if bidx == b_lo:
        slot = Int32(1)
    mine = scratch_base + Int64(((bidx * 2 + slot) * partial_len + thread_off) * 4)
    for j in cutlass.range_constexpr(n_acc):
        _st_global_f32(mine, 4 * stride * j, acc[j])


@cute.jit
def sum_pieces(acc, scratch_base: Int64, b_lo, b_hi, partial_len: cutlass.Constexpr,
               thread_off, n_acc: cutlass.Constexpr, stride: cutlass.Constexpr):
    """``acc[j]`` = the sum of the pieces of CTAs ``b_lo .. b_hi`` in that order (after a fence
    that makes their parked values visible): slot 1 of ``b_lo``, then slot 0 of the others."""
    first = scratch_base + Int64(((b_lo * 2 + 1) * partial_len + thread_off) * 4)
    for j in cutlass.range_constexpr(n_acc):
        acc[j] = _ld_global_cg_f32(first, 4 * stride * j)
    for b in cutlass.range(b_lo + 1, b_hi + 1, unroll=1):
        piece = scratch_base + Int64((b * 2 * partial_len + thread_off) * 4)
        for j in cutlass.range_constexpr(n_acc):
            acc[j] = acc[j] + _ld_global_cg_f32(piece, 4 * stride * j)


class StreamKTiles:
    """The stream-K mode of :class:`~nvfp4_ops.kernels.cute.w4a16_wgmma.W4A16WgmmaGemm` (its
    base class; ``WgmmaConfig.streamk > 0``): the producer and the consumers over this CTA's
    units, and the fix-up of partial tiles. The k loop, the decode, the scales and the
    epilogue are the kernel's own (:meth:`tile`, :meth:`registers`, :meth:`epilogue`, ...),
    shared with the one-tile-per-CTA mode."""

    def streamk_item(self, i, start, end, n_tiles):
        """``(k0, k1, tm, tn)``: the stages ``[k0, k1)`` of output tile ``i`` (feature tile
        ``tn``, token tile ``tm``) inside this CTA's units ``[start, end)`` (plain Python)."""
        kt_n = self.k_tiles
        k0 = cutlass.max(start - i * kt_n, 0)
        k1 = cutlass.min(end - i * kt_n, kt_n)
        tm = i // n_tiles
        return k0, k1, tm, i - tm * n_tiles

    def streamk_work(self, num_rows):
        """Stream-K work of this CTA (plain Python, inlined while tracing): ``(start, end,
        units, grid size, feature tiles)``, units ``[start, end)`` of the (output tile, k tile)
        pairs (:mod:`nvfp4_ops.kernels.cute.streamk`)."""
        cfg = self.cfg
        n_tiles = cfg.n_out // cfg.features_per_cta
        units = Int64(n_tiles * self.k_tiles) * Int64((num_rows + (cfg.block_m - 1))
                                                      // cfg.block_m)
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        start, end = span(units, bidx, gdim)
        return start, end, units, gdim, n_tiles

    @cute.jit
    def producer_streamk(self, pipe, tma_b, m_b, tma_w, m_w, s_b, s_w, num_rows, tma_s=None,
                         m_s=None, s_s=None, w_scale=None):
        """:meth:`producer` over this CTA's stream-K units: per output tile (feature tile
        ``i % n_tiles``, token tile ``i // n_tiles``) its stages ``k0 .. k1 - 1``."""
        kt_n = self.k_tiles
        t_sb, t_gb, t_sw, t_gw = self.tma_views(tma_b, m_b, tma_w, m_w, s_b, s_w, None)
        sub = self.sub
        t_ss = t_gs = None
        if const_expr(sub > 1 and not self.cfg.scale_ahead):
            g_s = cute.local_tile(m_s, (self.box_rows, 16), (None, None))
            t_ss, t_gs = cpasync.tma_partition(
                tma_s, 0, cute.make_layout(1), cute.group_modes(s_s, 0, 2),
                cute.group_modes(g_s, 0, 2))
        start, end, _, _, n_tiles = self.streamk_work(num_rows)
        lane = cute.arch.lane_idx()
        views = (tma_b, tma_w, tma_s, t_sb, t_gb, t_sw, t_gw, t_ss, t_gs, s_s, w_scale, lane)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        if end > start:
            i0 = start // kt_n
            skip = Int32(0)
            if const_expr(self.cfg.pdl):
                # launch overlap: the first item's first stages (weights, scales) stream while
                # the previous kernel finishes; their activations (its output, perhaps) only
                # after griddepcontrol.wait, on the same stage barriers
                f0, f1, ftm, ftn = self.streamk_item(i0, start, end, n_tiles)
                skip = cutlass.min(f1 - f0, self.stages)
                for kt in cutlass.range(f0, f0 + skip, unroll=1):
                    self.issue_stage(pipe, state, kt, f0, ftm, ftn, views, weights=True,
                                     acts=False)
                    state.advance()
                cute.arch.griddepcontrol_wait()
                early = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                     self.stages)
                for kt in cutlass.range(f0, f0 + skip, unroll=1):
                    self.issue_stage(pipe, early, kt, f0, ftm, ftn, views, weights=False,
                                     acts=True)
                    early.advance()
            for i in cutlass.range(i0, (end - 1) // kt_n + 1, unroll=1):
                k0, k1, tm, tn = self.streamk_item(i, start, end, n_tiles)
                for kt in cutlass.range(k0 + cutlass.select_(i == i0, skip, 0), k1, unroll=1):
                    self.issue_stage(pipe, state, kt, k0, tm, tn, views)
                    state.advance()

    def issue_stage(self, pipe, state, kt, k0, tm, tn, views, weights=True, acts=True):
        """Fill ring slot ``state`` with stage ``kt`` of output tile ``(tm, tn)`` (a stream-K
        piece starting at ``k0``): acquire the slot and copy the weights and block scales
        (``weights``), the activations (``acts``), on the slot's full barrier (plain Python,
        inlined while tracing)."""
        tma_b, tma_w, tma_s, t_sb, t_gb, t_sw, t_gw, t_ss, t_gs, s_s, w_scale, lane = views
        sub = self.sub
        nb = self.num_boxes
        ahead = self.cfg.scale_ahead
        if weights:
            if const_expr(ahead):
                # the cp.async copies and their arrive go first: the arrive raises the phase's
                # pending count when issued, so the phase cannot complete on the TMA bytes alone
                pipe.sync_object_empty.wait(state.index, state.phase)
                self.copy_scales_ahead(state.index, kt, tn, lane, s_s, w_scale,
                                       pipe.producer_get_barrier(state), kt == k0)
                pipe.sync_object_full.arrive(state.index, pipe.producer_mask)
            else:
                pipe.producer_acquire(state)
        bar = pipe.producer_get_barrier(state)
        if acts:
            for q in range(sub):
                cute.copy(tma_b, t_gb[(None, tm, kt * sub + q)],
                          t_sb[(None, state.index * sub + q)], tma_bar_ptr=bar)
        if weights:
            if const_expr(sub > 1 and not ahead):
                # stages kt & ~1 and kt | 1 share a 16-byte box
                cute.copy(tma_s, t_gs[(None, tn, kt // 2)], t_ss[(None, state.index)],
                          tma_bar_ptr=bar)
            if const_expr(self.box_rows > 32):
                cute.copy(tma_w, t_gw[(None, tn, kt)], t_sw[(None, state.index)],
                          tma_bar_ptr=bar)
            else:
                for b in range(nb):
                    cute.copy(tma_w, t_gw[(None, tn * nb + b, kt)],
                              t_sw[(None, state.index * nb + b)], tma_bar_ptr=bar)
        if acts:
            pipe.producer_commit(state)  # (a no-op for TMA: the copies complete the stage)

    def copy_scales_ahead(self, index, kt, tn, lane, s_s, w_scale, bar, first):
        """``scale_ahead``: this producer lane's ``cp.async`` copies of rows ``lane + 32 j``'s
        block scales into ring slot ``index`` (16 bytes per row: bytes 0-7 stage ``kt``'s, only
        where ``first``, the stream-K piece's first stage; 8-15 stage ``kt + 1``'s, zeros after
        the last), then its ``cp.async.mbarrier.arrive`` on the slot's full barrier ``bar``
        (plain Python, inlined while tracing)."""
        cfg = self.cfg
        dst = s_s.iterator.toint() + index * (self.box_rows * 16) + lane * 16
        src = (w_scale.iterator.toint() + Int64(tn * self.box_rows + lane) * (cfg.k // 16)
               + Int64(kt) * 8)
        row_step = 32 * (cfg.k // 16)
        more = cutlass.select_(kt + 1 < self.k_tiles, Int32(8), Int32(0))
        for j in range(self.box_rows // 32):
            cp_async_ca8(dst + j * 512 + 8, src + Int64(j * row_step + 8), more)
            cp_async_ca8(dst + j * 512, src + Int64(j * row_step), Int32(8), first)
        cp_async_mbarrier_arrive(bar.toint())

    @cute.jit
    def consumer_streamk(self, pipe, tiled_mma, s_b, s_w, w_scale, w_global, out, bias,
                         swiglu_limit, counters, scratch, flag, num_rows, tidx, wg, s_s=None):
        """:meth:`consumer` (``none`` epilogue, no split-K) over this CTA's stream-K units: per
        output tile, its stages ``k0 .. k1 - 1`` into zeroed accumulators through
        :meth:`tile` (the same loop as :meth:`consumer`), then the output (a whole tile) or
        :meth:`streamk_fixup`. The ring runs on across tiles; a tile's last stage is released
        once its WGMMAs have retired."""
        kt_n = self.k_tiles
        lt = tidx % 128
        wq = lt // 32
        lane = lt % 32
        grp = lane // 4
        quad = lane % 4
        sel = quad | ((quad + 4) << 4) | (quad << 8) | ((quad + 4) << 12)
        off_lo, off_hi = self.a_row_offsets(wg, wq, grp, quad)
        w_smem = s_w.iterator.toint()
        stage_bytes_w = self.w_stage_bytes
        s_base = w_scale.iterator.toint()
        ss = None
        if const_expr(self.sub > 1):
            # this lane's share of its quad's scales (load_stage_scales): the lo row (quad
            # lanes 0-1) or the hi row (2-3), both 32-k chunks of 64-k tile quad % 2; the
            # scale box holds 16 bytes per row (a stage pair)
            srow = 64 * wg + 16 * wq + grp + 8 * (quad // 2)
            ss = s_s.iterator.toint() + srow * 16 + 4 * (quad % 2)

        t_cb, acc, frags, raw, scl, sc = self.registers(tiled_mma, s_b, lt)
        if const_expr(self.cfg.pdl):
            # the counters, the scratch, the output (and the activations, through the ring)
            # belong to the chain: wait for the previous kernel, then let the next one launch
            cute.arch.griddepcontrol_wait()
            if tidx == 0:
                cute.arch.griddepcontrol_launch_dependents()

        start, end, units, gdim, n_tiles = self.streamk_work(num_rows)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        rel = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        tile_args = (tiled_mma, acc, frags, raw, scl, sc, t_cb, w_smem, stage_bytes_w, off_lo,
                     off_hi, sel)
        if end > start:
            for i in cutlass.range(start // kt_n, (end - 1) // kt_n + 1, unroll=1):
                k0, k1, tm, tn = self.streamk_item(i, start, end, n_tiles)
                row_lo, row_hi = self.a_weight_rows(tn, wg, wq, grp)
                s_lo, s_hi = self.scale_rows(s_base, row_lo, row_hi, quad)
                acc.fill(0.0)
                if const_expr(self.sub == 1):
                    self.load_scales(sc, 0, s_lo, s_hi, k0)
                pipe.consumer_wait(state)
                if const_expr(self.sub > 1):
                    self.load_stage_scales(sc, ss, state.index, k0)
                self.load_chunk(raw, scl, w_smem + state.index * stage_bytes_w, off_lo, off_hi,
                                sc[0], sc[1], 0, sel)
                # the stages as in :meth:`consumer`: first, middle, last (or a single one)
                run = (pipe, tile_args, sc, s_lo, s_hi)
                if k1 - k0 == 1:
                    state, rel = self.stage_tiles(*run, state, rel, k0, True, True, ss)
                else:
                    state, rel = self.stage_tiles(*run, state, rel, k0, True, False, ss)
                    for kt in cutlass.range(k0 + 1, k1 - 1, unroll=1):
                        state, rel = self.stage_tiles(*run, state, rel, kt, False, False, ss)
                    state, rel = self.stage_tiles(*run, state, rel, k1 - 1, False, True, ss)
                warpgroup.wait_group(0)
                # every WGMMA of the tile has retired: free its last stage now (the next tile's
                # first k tile frees nothing, as in :meth:`tile`)
                pipe.consumer_release(rel)
                rel.advance()
                finished = Int32(1)
                if k1 - k0 != kt_n:
                    finished = self.streamk_fixup(acc, i, counters, scratch, flag, units, gdim,
                                                  tidx, wg)
                if finished != 0:
                    # the ``none`` epilogue: no router weights (row_scale None)
                    self.epilogue(acc, w_global, out, None, bias, swiglu_limit, Int32(0), tm,
                                  num_rows, row_lo, row_hi, quad)

    def stage_tiles(self, pipe, tile_args, sc, s_lo, s_hi, state, rel, kt, first: bool,
                    last: bool, ss=None):
        """The ``sub`` 64-k tiles of stream-K stage ``kt`` (:meth:`tile`); before each, the
        block scales move one tile on (not before the output tile's first) and the next
        tile's are loaded (not before its last); with 128-k stages (``ss``: this lane's
        scale address in stage 0) the stage's scales are already in registers
        (:meth:`load_stage_scales`, at each stage's wait). Plain Python, inlined while
        tracing."""
        sub = self.sub
        for q in range(sub):
            if const_expr(sub > 1):
                state, rel = self.tile(pipe, state, rel, *tile_args, first, last, q,
                                       (ss, kt + 1))
                continue
            if not (first and q == 0):
                sc[0] = sc[2]
                sc[1] = sc[3]
            if not last:
                self.load_scales(sc, 2, s_lo, s_hi, kt + 1)
            state, rel = self.tile(pipe, state, rel, *tile_args, first, last, q)
        return state, rel

    @cute.jit
    def streamk_fixup(self, acc, item, counters, scratch, flag, units, gdim, tidx, wg):
        """All consumer threads of a CTA holding a piece of output tile ``item`` (fewer than all
        its k tiles): park it, count it (thread 0, the count broadcast through ``flag``) and, if
        it is the last piece to arrive, sum all pieces in K order into ``acc``, reset the
        counter and return 1 (the caller then writes the output); else return 0
        (:mod:`nvfp4_ops.kernels.cute.streamk`)."""
        cfg = self.cfg
        bidx, _, _ = cute.arch.block_idx()
        nthreads = 128 * cfg.consumers
        n_acc = cute.size(acc)
        plen = cfg.partial_len
        off = wg * 128 * n_acc + tidx % 128
        b_lo, b_hi = item_owners(item, self.k_tiles, units, gdim)
        base = scratch.iterator.toint()
        park(acc, base, bidx, b_lo, plen, off, n_acc, 128)
        # thread 0's acquire-release atomic, between two CTA barriers, publishes this CTA's
        # parked piece and acquires the others' (no GPU-scope fence per thread)
        cute.arch.barrier(barrier_id=1, number_of_threads=nthreads)
        counter = counters.iterator.toint() + Int64(item) * Int64(4)
        if tidx == 0:
            flag[0] = atom_add_acq_rel_u32(counter, 1)
        cute.arch.barrier(barrier_id=1, number_of_threads=nthreads)
        finished = Int32(0)
        if flag[0] == b_hi - b_lo:
            sum_pieces(acc, base, b_lo, b_hi, plen, off, n_acc, 128)
            if tidx == 0:
                st_global_u32(counter, Int32(0))
            finished = Int32(1)
        return finished
