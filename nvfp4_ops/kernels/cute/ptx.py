"""Generic PTX wrappers shared by the CuTeDSL kernels: shared-memory and global loads,
``cp.async`` and bulk copies, mbarriers, quad shuffles and byte permutes (``inline_ptx``,
inlined while a kernel is traced). Shared-memory addresses are 32-bit ``.shared::cta``
addresses. The FP4 decoders and the MMA wrapper are in :mod:`.fp4_ptx`.
"""

from __future__ import annotations

from cutlass import Int32, Int64
from cutlass.cute.arch import inline_ptx

__all__ = [
    "bulk_g2s",
    "cp_async_ca8",
    "cp_async_mbarrier_arrive",
    "fence_proxy_async",
    "ldg_u32",
    "lds_u16",
    "lds_u32_at",
    "lds_u8",
    "mbar_arrive",
    "mbar_arrive_expect_tx",
    "mbar_init",
    "mbar_inval",
    "mbar_wait",
    "pair_halves",
    "prmt",
    "shfl_quad",
    "shfl_quad_from",
]


def ldg_u32(addr: Int64):
    """4-byte read-only global load."""
    return inline_ptx(
        "ld.global.nc.b32 {$w0}, [{$r0}];",
        write_only_types=[Int32],
        read_only_args=[addr],
    )


def cp_async_ca8(dst: Int32, src: Int64, src_bytes: Int32, predicate=None) -> None:
    """8-byte ``cp.async`` global -> shared (through L1), reading ``src_bytes`` (0 or 8; the
    rest are zeros); only where ``predicate`` holds (None: always)."""
    inline_ptx("cp.async.ca.shared.global [{$r0}], [{$r1}], 8, {$r2};",
               read_only_args=[dst, src, src_bytes], predicate=predicate)


def cp_async_mbarrier_arrive(bar: Int32) -> None:
    """Arrive on the shared mbarrier at ``bar`` once this thread's earlier ``cp.async`` copies
    have landed (the pending count is raised now, so the phase waits for them)."""
    inline_ptx("cp.async.mbarrier.arrive.shared.b64 [{$r0}];", read_only_args=[bar])


def shfl_quad(value: Int32, src: int):
    """``value`` of lane ``src`` (static, 0-3) of this lane's quad (lanes ``4g .. 4g + 3``):
    ``shfl.sync.idx`` with segment mask 0x1c, so the source is a constant, not an address."""
    return inline_ptx(f"shfl.sync.idx.b32 {{$w0}}, {{$r0}}, {src}, 0x1c03, 0xffffffff;",
                      write_only_types=[Int32], read_only_args=[value])


def shfl_quad_from(value: Int32, src: Int32):
    """:func:`shfl_quad` with a per-lane source (0-3) held in a register."""
    return inline_ptx("shfl.sync.idx.b32 {$w0}, {$r0}, {$r1}, 0x1c03, 0xffffffff;",
                      write_only_types=[Int32], read_only_args=[value, src])


def lds_u32_at(addr: Int32, offset: int):
    """4-byte shared-memory load at ``addr + offset`` (a static byte offset)."""
    return inline_ptx(f"ld.shared.b32 {{$w0}}, [{{$r0}}+{offset}];",
                      write_only_types=[Int32], read_only_args=[addr])


def prmt(a: Int32, b: Int32, sel: Int32):
    """Byte permute: result byte i = byte ``(sel >> 4i) & 7`` of ``b:a``."""
    return inline_ptx("prmt.b32 {$w0}, {$r0}, {$r1}, {$r2};", write_only_types=[Int32],
                      read_only_args=[a, b, sel])


def mbar_init(bar: Int32, count: int) -> None:
    inline_ptx(f"mbarrier.init.shared::cta.b64 [{{$r0}}], {count};", read_only_args=[bar])


def mbar_wait(bar: Int32, parity: Int32) -> None:
    """Spin until the phase with parity ``parity`` of ``bar`` has completed."""
    inline_ptx(
        "{\n"
        ".reg .pred p;\n"
        "LAB_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [{$r0}], {$r1};\n"
        "@!p bra LAB_WAIT;\n"
        "}",
        read_only_args=[bar, parity],
    )


def mbar_arrive(bar: Int32) -> None:
    inline_ptx("mbarrier.arrive.shared::cta.b64 _, [{$r0}];", read_only_args=[bar])


def mbar_inval(bar: Int32) -> None:
    inline_ptx("mbarrier.inval.shared::cta.b64 [{$r0}];", read_only_args=[bar])


def fence_proxy_async() -> None:
    inline_ptx("fence.proxy.async.shared::cta;")


def mbar_arrive_expect_tx(bar: Int32, tx_bytes: int) -> None:
    inline_ptx(f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [{{$r0}}], {tx_bytes};",
               read_only_args=[bar])


def bulk_g2s(dst: Int32, src: Int64, nbytes: int, bar: Int32) -> None:
    """``nbytes`` (multiple of 16; both addresses 16-byte aligned) global -> shared by the
    bulk-copy engine, completing ``nbytes`` transaction bytes on ``bar``."""
    inline_ptx(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
        f"[{{$r0}}], [{{$r1}}], {nbytes}, [{{$r2}}];",
        read_only_args=[dst, src, bar],
    )


def lds_u8(addr: Int32, offset: int):
    return inline_ptx(f"ld.shared.u8 {{$w0}}, [{{$r0}}+{offset}];",
                      write_only_types=[Int32], read_only_args=[addr])


def lds_u16(addr: Int32, offset: int):
    return inline_ptx(f"ld.shared.u16 {{$w0}}, [{{$r0}}+{offset}];",
                      write_only_types=[Int32], read_only_args=[addr])


def pair_halves(x_lo: Int32, x_hi: Int32):
    """(x_lo.lo16 | x_hi.lo16 << 16, x_lo.hi16 | x_hi.hi16 << 16)."""
    return inline_ptx(
        "prmt.b32 {$w0}, {$r0}, {$r1}, 0x5410;\n"
        "prmt.b32 {$w1}, {$r0}, {$r1}, 0x7632;",
        write_only_types=[Int32, Int32],
        read_only_args=[x_lo, x_hi],
    )
