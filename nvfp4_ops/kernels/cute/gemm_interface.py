"""What every W4A16 GEMM kernel family shares: the epilogue names, the epilogue math, and
compiling a kernel from fake tensors of the common call interface.

The interface (``w4a16_gemm``, ``w4a16_stream`` and ``w4a16_wgmma`` all take it, in this order):
``a`` bf16 ``[P, K]``, ``w`` u8 ``[G, N, K/2]``, ``w_scale`` u8 (e4m3 bytes) ``[G, N, K/16]``,
``w_global`` fp32 ``[G, N]``, ``out`` bf16 ``[P, N_out]``, ``tile_expert`` int32
``[ceil(P / block_m)]``, ``row_scale`` fp32 ``[P]``, ``bias`` bf16 ``[N]``, ``swiglu_limit``
fp32, stream. ``P`` and ``G`` are symbolic: one binary serves every token count and expert
count. See ``w4a16_gemm``'s module docstring for the meaning of each argument.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32

__all__ = ["EPILOGUES", "DirectLaunch", "clamped_swiglu", "compile_from_fakes"]

EPILOGUES = ("none", "swiglu", "row_scale")


def clamped_swiglu(gate, up, limit):
    """``silu(min(gate, L)) * clamp(up, -L, L)`` on fp32 values (``L = inf``: no clamp).

    Plain Python: inlined while a kernel is traced, like writing it out in place.
    """
    gate = cutlass.min(gate, limit)
    up = cutlass.max(cutlass.min(up, limit), -limit)
    return gate / (Float32(1.0) + cute.math.exp(-gate)) * up


class DirectLaunch:
    """The host-side ``__call__`` of kernels whose ``kernel`` takes the interface arguments
    unchanged: grid ``(N_out / features_per_cta, ceil(P / block_m))``, ``threads`` per CTA,
    ``launch_smem`` bytes of dynamic shared memory, on the given stream. Subclasses set
    ``cfg`` (with ``n_out``, ``block_m``), ``features_per_cta``, ``threads``, ``launch_smem``
    and define the ``@cute.kernel`` method ``kernel``; a persistent kernel overrides
    :meth:`grid`."""

    def grid(self, grid_n, grid_m):
        """Launch grid for ``grid_n`` feature tiles x ``grid_m`` token tiles (plain Python,
        inlined while tracing; ``grid_m`` is symbolic)."""
        return [grid_n, grid_m, 1]

    @cute.jit
    def __call__(
        self,
        a: cute.Tensor,
        w: cute.Tensor,
        w_scale: cute.Tensor,
        w_global: cute.Tensor,
        out: cute.Tensor,
        tile_expert: cute.Tensor,
        row_scale: cute.Tensor,
        bias: cute.Tensor,
        swiglu_limit: Float32,
        stream,
    ):
        cfg = self.cfg
        num_rows = a.shape[0]
        grid_n = cfg.n_out // self.features_per_cta
        grid_m = (num_rows + (cfg.block_m - 1)) // cfg.block_m
        kernel = self.kernel(a, w, w_scale, w_global, out, tile_expert, row_scale, bias,
                             swiglu_limit)
        kernel.launch(
            grid=self.grid(grid_n, grid_m),
            block=[self.threads, 1, 1],
            smem=self.launch_smem,
            stream=stream,
        )


def compile_from_fakes(kernel, cfg, *, scale_align: int, extra_options: str = ""):
    """Compile ``kernel`` (a family's kernel object for ``cfg``) for the common interface
    from fake tensors (no GPU needed); returns the tvm-ffi callable.

    ``cfg`` provides ``n``, ``k``, ``n_out`` and ``arch``. ``a`` and ``w`` are assumed 16-byte
    aligned, ``w_scale`` ``scale_align``-byte aligned (the torch side guarantees 16). Call the
    result as ``fn(a, w, w_scale_u8, w_global, out, tile_expert, row_scale, bias, limit)``
    with torch tensors; it launches on torch's current stream.
    """
    from cutlass.cute.runtime import make_fake_compact_tensor
    from cutlass.runtime import make_fake_stream

    sym = cute.sym_int
    n, k = cfg.n, cfg.k
    row_major2 = (1, 0)
    row_major3 = (2, 1, 0)
    a = make_fake_compact_tensor(BFloat16, (sym(), k), stride_order=row_major2, assumed_align=16)
    w = make_fake_compact_tensor(
        cutlass.Uint8, (sym(), n, k // 2), stride_order=row_major3, assumed_align=16
    )
    w_scale = make_fake_compact_tensor(
        cutlass.Uint8, (sym(), n, k // 16), stride_order=row_major3, assumed_align=scale_align
    )
    w_global = make_fake_compact_tensor(Float32, (sym(), n), stride_order=row_major2)
    out = make_fake_compact_tensor(BFloat16, (sym(), cfg.n_out), stride_order=row_major2)
    tile_expert = make_fake_compact_tensor(Int32, (sym(),))
    row_scale = make_fake_compact_tensor(Float32, (sym(),))
    bias = make_fake_compact_tensor(BFloat16, (sym(),))
    return cute.compile(
        kernel,
        a, w, w_scale, w_global, out, tile_expert, row_scale, bias, Float32(0.0),
        make_fake_stream(use_tvm_ffi_env_stream=True),
        options=f"--gpu-arch {cfg.arch} --enable-tvm-ffi" + extra_options,
    )
