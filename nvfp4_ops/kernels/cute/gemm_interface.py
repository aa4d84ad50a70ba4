"""What every W4A16 GEMM kernel family shares: the epilogue names, the epilogue math, and
compiling a kernel from fake tensors of the common call interface.

The interface (``w4a16_gemm``, ``w4a16_stream`` and ``w4a16_wgmma`` all take it, in this order):
``a`` bf16 ``[P, K]``, ``w`` u8 ``[G, N, K/2]``, ``w_scale`` u8 (e4m3 bytes) ``[G, N, K/16]``
(UE8M0 bytes ``[G, N, K/32]`` for a config with ``mx``: :attr:`GemmProblem.scale_k`),
``w_global`` fp32 ``[G, H2, N / H2]`` (any strides, see below), ``out`` bf16 ``[P, N_out]``,
``tile_expert`` int32 ``[ceil(P / block_m)]``, ``tile_rows`` int32 ``[ceil(P / block_m)]``,
``row_scale`` fp32 ``[P]``, ``bias`` bf16 ``[N]``, ``counters`` int32 and ``scratch`` fp32 (the
stream-K workspace of ``w4a16_wgmma``: a zeroed counter per output tile, two partial sums per
CTA; one-element dummies for every other config), ``swiglu_limit`` fp32, stream. ``P`` and
``G`` are symbolic: one binary serves every token count and expert count. See ``w4a16_gemm``'s
module docstring for the meaning of each argument.

Global scales (:func:`row_global` reads them): ``w_global[g, h, r]`` is the fp32 global scale
of weight row ``h * N/H2 + r`` of group ``g``. ``H2 = 2`` for the ``swiglu`` epilogue
(``[g, 0, r]`` = gate row ``r``, ``[g, 1, r]`` = up row ``r + N/2``), ``H2 = 1`` otherwise. All
three strides are runtime arguments and may be 0, so the torch side passes a per-tensor scalar,
a gate/up pair per expert or a per-row ``[G, N]`` table as a view, never a per-call expansion
(``per_group_global_view``, ``gate_up_global_view``, ``per_row_global_view`` in
:mod:`nvfp4_ops.kernels.linear_cuda`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, const_expr

from nvfp4_ops.orders.kperm import NATURAL

__all__ = ["EPILOGUES", "LAUNCH_OVERLAPS", "DirectLaunch", "GemmProblem", "clamped_swiglu",
           "compile_from_fakes", "epilogue_value", "global_halves", "row_global"]

EPILOGUES = ("none", "swiglu", "row_scale")
#: how a launch overlaps the previous kernel on the stream (a config's ``overlap``): ``none``;
#: ``after`` (programmatic dependent launch: resident and streaming weights while the previous
#: kernel finishes, waiting for it before reading its output); ``beside`` (as ``after``, but
#: nothing waits before working: what it reads was complete before the previous kernel let it
#: launch, and it writes rows the previous kernel does not; CTA 0 waits at its end)
LAUNCH_OVERLAPS = ("none", "after", "beside")


@dataclass(frozen=True)
class GemmProblem:
    """The fields every family's config starts with, in this order (configs are built
    positionally): ``n``/``k`` weight rows / reduction length per group (static),
    ``epilogue`` (one of :data:`EPILOGUES`), ``has_bias`` (``none`` only), ``grouped``
    (per-tile expert ids), ``block_m`` (tokens per CTA, one of the family's ``BLOCK_MS``).
    A family's config adds its tile fields and ``arch``, sets ``PREFIX`` and ``BLOCK_MS`` and
    calls :meth:`check_problem` first in ``__post_init__``."""

    n: int
    k: int
    epilogue: str = "none"
    has_bias: bool = False
    grouped: bool = False
    block_m: int = 16

    #: config-name prefix of the family, and the token tiles it compiles
    PREFIX: ClassVar[str] = ""
    BLOCK_MS: ClassVar[tuple[int, ...]] = ()
    #: the permuted activation order the family can read (a name of
    #: :data:`nvfp4_ops.orders.kperm.LAYOUTS`; its configs then have an ``act_order`` field),
    #: or None
    PERMUTED_ORDER: ClassVar[str | None] = None

    def check_problem(self) -> None:
        act_order = getattr(self, "act_order", NATURAL)
        if act_order not in (NATURAL, self.PERMUTED_ORDER):
            raise ValueError(f"act_order must be {NATURAL!r}"
                             + (f" or {self.PERMUTED_ORDER!r}" if self.PERMUTED_ORDER else "")
                             + f" for {type(self).__name__}, got {act_order!r}")
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue must be one of {EPILOGUES}, got {self.epilogue!r}")
        if self.block_m not in self.BLOCK_MS:
            raise ValueError(f"block_m must be one of {self.BLOCK_MS}, got {self.block_m}")
        if self.has_bias and self.epilogue != "none":
            raise ValueError("bias is only supported with the 'none' epilogue")

    @property
    def n_out(self) -> int:
        """Output features: ``n``, or ``n / 2`` for SwiGLU (gate and up rows give one each)."""
        return self.n // 2 if self.epilogue == "swiglu" else self.n

    @property
    def scale_k(self) -> int:
        """K values per byte of ``w_scale``: 16 (e4m3 block scales), or 32 for a config whose
        family has a true ``mx`` field (MXFP4's UE8M0 scales)."""
        return 32 if getattr(self, "mx", False) else 16

    @property
    def pdl(self) -> bool:
        """Launched with programmatic dependent launch (``overlap`` ``after`` or ``beside``)."""
        return getattr(self, "overlap", "none") != "none"

    @property
    def sibling(self) -> bool:
        """Launched beside the previous kernel (``overlap`` ``beside``): no thread waits before
        working, CTA 0 waits at the end."""
        return getattr(self, "overlap", "none") == "beside"

    @property
    def permuted(self) -> bool:
        """The activations are in the family's permuted k order (``act_order`` not natural)."""
        return getattr(self, "act_order", NATURAL) != NATURAL

    @property
    def order_tag(self) -> str:
        """The config name's part for the family's ``order`` field (a
        :class:`~nvfp4_ops.orders.WeightOrder`): ``_wp`` for the ``wperm`` bits, ``_wp_wf`` for
        the fragment order with them, empty for the checkpoint order."""
        order = self.order
        return ("_wp" if order.wperm_bits else "") + ("_wf" if order.fragment_order else "")

    @property
    def name_head(self) -> str:
        """The config name up to the family's tile fields."""
        return (f"{self.PREFIX}_n{self.n}_k{self.k}_{self.epilogue}"
                f"{'_bias' if self.has_bias else ''}{'_grouped' if self.grouped else ''}"
                f"_bm{self.block_m}")


def global_halves(epilogue: str) -> int:
    """``H2`` of the ``w_global`` argument ``[G, H2, N / H2]``: 2 for ``swiglu`` (gate / up
    halves), else 1."""
    return 2 if epilogue == "swiglu" else 1


def row_global(cfg, w_global, expert, feature, up: bool = False):
    """The fp32 global scale of one weight row of group ``expert``: row ``feature`` (``up``
    False), or for ``swiglu`` the up row ``feature + N/2`` of output feature ``feature``
    (``up`` True; ``feature`` is then also the gate row). ``up`` is static.

    Plain Python: inlined while a kernel is traced (an indexed load, ``w_global``'s strides are
    runtime values that may be 0).
    """
    if const_expr(up):
        assert cfg.epilogue == "swiglu", "up rows exist only for the swiglu epilogue"
        return w_global[expert, 1, feature]
    return w_global[expert, 0, feature]


def clamped_swiglu(gate, up, limit):
    """``silu(min(gate, L)) * clamp(up, -L, L)`` on fp32 values (``L = inf``: no clamp).

    Plain Python: inlined while a kernel is traced, like writing it out in place.
    """
    gate = cutlass.min(gate, limit)
    up = cutlass.max(cutlass.min(up, limit), -limit)
    return gate / (Float32(1.0) + cute.math.exp(-gate)) * up


def epilogue_value(cfg, acc, i, i_up, unscale, w_global, expert, row, token, row_scale, bias,
                   swiglu_limit):
    """The output value of (``token``, feature ``row``) from accumulator element ``acc[i]``
    (and, for ``swiglu``, the matching up row's ``acc[i_up]``; ``i``/``i_up`` static): times
    ``unscale`` (the decoder's power of two) and the row's global scale (gate and up each
    their own), then the epilogue.

    Plain Python: inlined while a kernel is traced (the two families with mma.sync C
    fragments, ``w4a16_gemm`` and ``w4a16_stream``).
    """
    v = acc[i] * unscale
    v = v * row_global(cfg, w_global, expert, row)
    if const_expr(cfg.epilogue == "swiglu"):
        up = acc[i_up] * unscale
        up = up * row_global(cfg, w_global, expert, row, up=True)
        v = clamped_swiglu(v, up, swiglu_limit)
    if const_expr(cfg.epilogue == "row_scale"):
        v = v * row_scale[token]
    if const_expr(cfg.has_bias):
        v = v + bias[row].to(Float32)
    return v


class DirectLaunch:
    """The host-side ``__call__`` of kernels whose ``kernel`` takes the interface arguments
    unchanged: grid ``(N_out / features_per_cta, ceil(P / block_m))``, ``threads`` per CTA,
    ``launch_smem`` bytes of dynamic shared memory, on the given stream. Subclasses set
    ``cfg`` (with ``n_out``, ``block_m``), ``features_per_cta``, ``threads``, ``launch_smem``
    and define the ``@cute.kernel`` method ``kernel``; a persistent kernel overrides
    :meth:`grid`. A config with a true ``pdl`` field is launched with programmatic dependent
    launch (its kernel must then call ``griddepcontrol.wait`` before reading what the previous
    kernel wrote). A kernel that takes other arguments (TMA atoms, say) overrides
    :meth:`make_kernel`."""

    def grid(self, grid_n, grid_m):
        """Launch grid for ``grid_n`` feature tiles x ``grid_m`` token tiles (plain Python,
        inlined while tracing; ``grid_m`` is symbolic)."""
        return [grid_n, grid_m, 1]

    def make_kernel(self, a, w, w_scale, w_global, out, tile_expert, tile_rows, row_scale, bias,
                    swiglu_limit):
        """The ``@cute.kernel`` to launch, given the interface arguments (plain Python, inlined
        while tracing): ``kernel`` on them unchanged."""
        return self.kernel(a, w, w_scale, w_global, out, tile_expert, tile_rows, row_scale, bias,
                           swiglu_limit)

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
        counters: cute.Tensor,  # the stream-K workspace: unused by these families
        scratch: cute.Tensor,
        swiglu_limit: Float32,
        stream,
    ):
        cfg = self.cfg
        num_rows = a.shape[0]
        grid_n = cfg.n_out // self.features_per_cta
        grid_m = (num_rows + (cfg.block_m - 1)) // cfg.block_m
        kernel = self.make_kernel(a, w, w_scale, w_global, out, tile_expert, tile_rows,
                                  row_scale, bias, swiglu_limit)
        kernel.launch(
            grid=self.grid(grid_n, grid_m),
            block=[self.threads, 1, 1],
            smem=self.launch_smem,
            stream=stream,
            use_pdl=cfg.pdl,
        )


def compile_from_fakes(kernel, cfg, *, scale_align: int, extra_options: str = ""):
    """Compile ``kernel`` (a family's kernel object for ``cfg``) for the common interface
    from fake tensors (no GPU needed); returns the tvm-ffi callable.

    ``cfg`` provides ``n``, ``k``, ``epilogue``, ``n_out`` and ``arch``. ``a`` and ``w`` are
    assumed 16-byte aligned, ``w_scale`` ``scale_align``-byte aligned (the torch side guarantees
    16); ``w_global`` is ``[G, H2, N / H2]`` with three runtime strides (any, 0 included; see
    the module docstring), every other tensor compact row-major. Call the result as
    ``fn(a, w, w_scale_u8, w_global, out, tile_expert, tile_rows, row_scale, bias, counters,
    scratch, limit)`` with torch tensors; it launches on torch's current stream. Each family's
    ``compile_gemm(cfg, extra_options="")`` is this with its own kernel class.
    """
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor
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
        cutlass.Uint8, (sym(), n, k // cfg.scale_k), stride_order=row_major3,
        assumed_align=scale_align
    )
    halves = global_halves(cfg.epilogue)
    # dynamic strides: tvm-ffi then takes stride-0 (expanded) views exactly, so no caller
    # expands a scalar scale per call
    w_global = make_fake_tensor(Float32, (sym(), halves, n // halves), (sym(), sym(), sym()))
    out = make_fake_compact_tensor(BFloat16, (sym(), cfg.n_out), stride_order=row_major2)
    tile_expert = make_fake_compact_tensor(Int32, (sym(),))
    tile_rows = make_fake_compact_tensor(Int32, (sym(),))
    row_scale = make_fake_compact_tensor(Float32, (sym(),))
    bias = make_fake_compact_tensor(BFloat16, (sym(),))
    counters = make_fake_compact_tensor(Int32, (sym(),))
    scratch = make_fake_compact_tensor(Float32, (sym(),))
    return cute.compile(
        kernel,
        a, w, w_scale, w_global, out, tile_expert, tile_rows, row_scale, bias, counters, scratch,
        Float32(0.0),
        make_fake_stream(use_tvm_ffi_env_stream=True),
        options=f"--gpu-arch {cfg.arch} --enable-tvm-ffi" + extra_options,
    )
