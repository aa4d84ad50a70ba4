"""Stream-K for the dense WGMMA kernel (``WgmmaConfig.streamk``): the work split and the
fix-up of partial tiles. CuTeDSL, inlined while a kernel is traced.

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
from cutlass import Float32, Int32, Int64
from cutlass.cute.arch import inline_ptx

__all__ = ["atom_add_acq_rel_u32", "item_owners", "park", "span", "st_global_u32",
           "sum_pieces"]


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
