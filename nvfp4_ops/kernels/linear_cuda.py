"""CUDA implementations of ``nvfp4::linear`` / ``nvfp4::mlp``, and the launcher every W4A16 GEMM
goes through (:func:`run_gemm`, which the MoE uses too).

A launch takes a :class:`~nvfp4_ops.kernels.dispatch.GemmPlan` (which kernel, in which
config) and runs its binary on torch's current stream (tvm-ffi reads it at call time). Nothing
here chooses a kernel. Everything is CUDA-graph safe: no host syncs, grid sizes from static
shapes only, workspace buffers that are reused only where launches cannot overlap.

Global scales reach the kernels as fp32 ``[G, H2, N / H2]`` *views* of the op arguments
(``H2 = 2`` for the SwiGLU GEMM: gate half, up half; 1 otherwise; any strides, 0 where one
scale covers many rows; :mod:`nvfp4_ops.kernels.cute.gemm_interface`), built by
:func:`per_row_global_view`, :func:`per_group_global_view` and :func:`gate_up_global_view`:
no per-call expansion kernel, no cache of expanded rows. The ops build the kernel form of
their weights (these views, 3-D codes, scale bytes as uint8) once per weight tensors and reuse
it across eager calls (:func:`memo_views`), then launch with ``run_gemm(..., check=False)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch

from nvfp4_ops import _compile, _env
from nvfp4_ops._weak import entry_refs
from nvfp4_ops.kernels import dispatch, eager_graphs
from nvfp4_ops.kernels.cute import w4a16_gemm, w4a16_stream, w4a16_wgmma
from nvfp4_ops.kernels.dispatch import GemmPlan, WeightOrder

__all__ = [
    "STREAMK_COUNTERS_ENV",
    "StreamKWorkspace",
    "bound_gemm",
    "compile_function",
    "compiled",
    "gate_up_global_view",
    "gated_kernel_weights",
    "kernel_weight",
    "linear",
    "linear_launch",
    "memo_views",
    "mlp",
    "mlp_launch",
    "per_group_global_view",
    "per_row_global_view",
    "run_gemm",
    "run_once",
    "streamk_counters",
    "streamk_workspace",
]

#: each family's compile function, by config class
_COMPILERS = {
    w4a16_stream.StreamConfig: w4a16_stream.compile_gemm,
    w4a16_gemm.GemmConfig: w4a16_gemm.compile_gemm,
    w4a16_wgmma.WgmmaConfig: w4a16_wgmma.compile_gemm,
}
_dummies: dict[int | None, _Unused] = {}


def compile_function(config):
    """The family's ``compile_gemm(config, extra_options="")`` for a config of any family."""
    return _COMPILERS[type(config)]


def compiled(config):
    """The binary of a kernel config of any family (memory, else disk cache, else compiled;
    :func:`nvfp4_ops._compile.get_compiled`)."""
    build = compile_function(config)
    return _compile.get_compiled(config, lambda: build(config))


# ---------------------------------------------------------------------------- global scales


def _global_halves(epilogue: str) -> int:
    """``H2`` of a GEMM's global-scale argument: 2 for ``swiglu`` (gate, up halves), else 1."""
    return 2 if epilogue == "swiglu" else 1


def per_row_global_view(w_global: torch.Tensor, n: int, halves: int = 1) -> torch.Tensor:
    """Per-row global scales fp32 ``[G, N]`` (or ``[N]``: one group) as the kernels' ``[G, H2,
    N / H2]`` (``H2 = halves``: 2 for a SwiGLU GEMM, rows ``[0, N/2)`` gate, ``[N/2, N)`` up).

    A view (same storage, any input strides kept: ``(s0, s1 * N/H2, s1)``); never a copy.

    Raises:
        ValueError: not fp32 ``[G, N]`` / ``[N]``, or ``N`` not a multiple of ``halves``.
    """
    if w_global.dim() == 1:
        w_global = w_global.unsqueeze(0)
    if (w_global.dim() != 2 or w_global.shape[1] != n or n % halves != 0
            or w_global.dtype != torch.float32):
        raise ValueError(f"per-row global scales must be fp32 [G, {n}] or [{n}] with N "
                         f"divisible by {halves}, got {w_global.dtype} {tuple(w_global.shape)}")
    return w_global.unflatten(1, (halves, n // halves))


def per_group_global_view(scale: torch.Tensor, n: int) -> torch.Tensor:
    """One global scale per group (per-tensor: ``[]``; per expert: fp32 ``[G]``) as the
    kernels' ``[G, 1, N]`` (``[1, 1, N]`` for ``[]``): every row of group ``g`` reads
    ``scale[g]``. A view: strides ``(s0, s0, 0)`` (``(0, 0, 0)`` for ``[]``), same storage.

    Raises:
        ValueError: not fp32 ``[]`` / ``[G]``.
    """
    if scale.dim() > 1 or scale.dtype != torch.float32:
        raise ValueError(f"a per-group global scale must be fp32 [] or [G], got {scale.dtype} "
                         f"{tuple(scale.shape)}")
    if scale.dim() == 0:
        return scale.expand(1, 1, n)
    return scale.reshape(-1, 1, 1).expand(scale.shape[0], 1, n)


def gate_up_global_view(scale: torch.Tensor, inter: int) -> torch.Tensor:
    """A gate and an up global scale per group (fp32 ``[G, 2]``, or ``[2]``: one group) as the
    SwiGLU GEMM's ``[G, 2, I]``: gate rows ``[0, I)`` read ``scale[g, 0]``, up rows ``[I, 2I)``
    ``scale[g, 1]`` (kept separate, never folded). A view: strides ``(s0, s1, 0)``, same
    storage. Per-row scales (``[G, 2I]`` / ``[2I]``) go through :func:`per_row_global_view`
    with two halves.

    Raises:
        ValueError: not fp32 ``[G, 2]`` / ``[2]`` / ``[G, 2I]`` / ``[2I]``.
    """
    if scale.shape[-1] == 2 * inter != 2:
        return per_row_global_view(scale, 2 * inter, halves=2)
    if scale.dim() == 1:
        scale = scale.unsqueeze(0)
    if scale.dim() != 2 or scale.shape[1] != 2 or scale.dtype != torch.float32:
        raise ValueError(f"gate/up global scales must be fp32 [G, 2] or [2], got {scale.dtype} "
                         f"{tuple(scale.shape)}")
    return scale.unsqueeze(2).expand(scale.shape[0], 2, inter)


# ---------------------------------------------------------------------------- stream-K workspace


class StreamKWorkspace(NamedTuple):
    """What a stream-K launch needs besides its operands: ``counters`` int32 ``[items]`` (one
    per output tile, zero on entry and on exit) and ``scratch`` fp32 holding two partial sums
    per CTA (the kernel sizes its grid from the scratch's length). The kernels take them as
    their own ``counters`` / ``scratch`` operands."""

    counters: torch.Tensor
    scratch: torch.Tensor


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def streamk_workspace(config, num_rows: int, device: torch.device) -> StreamKWorkspace:
    """The workspace of a stream-K WGMMA config over ``num_rows`` tokens: reused counters
    (:func:`streamk_counters`) and a scratch for ``min(units, SMs * streamk)`` CTAs, allocated
    per call (no kernel reads it before writing it)."""
    items, units = config.streamk_units(num_rows)
    ctas = min(units, _sm_count(device) * config.streamk)
    scratch = torch.empty(ctas * 2 * config.partial_len, dtype=torch.float32, device=device)
    return StreamKWorkspace(streamk_counters(items, device), scratch)


#: ``NVFP4_OPS_STREAMK_COUNTERS``: ``reuse`` (default) or ``per-call`` (:func:`streamk_counters`)
STREAMK_COUNTERS_ENV = _env.STREAMK_COUNTERS
_counters: dict[tuple, torch.Tensor] = {}


def streamk_counters(items: int, device: torch.device) -> torch.Tensor:
    """Zeroed int32 tile counters ``[items]`` for a stream-K launch on the current stream.

    The kernel leaves its counters at zero (each tile's last piece resets its own), so one
    buffer serves every launch that cannot overlap another one using it:

    * eager: one buffer per (device, stream, ``items``), zeroed once when first made;
    * under CUDA-graph capture: one per (capture, capturing stream, ``items``), made (and its
      zeroing captured) at the first call of that capture; each replay zeroes it once, at
      that point. Launches in different graphs, on different streams or on different branches
      of one capture never share a buffer; those sharing one are ordered by their stream.

    Why: a fresh buffer per call puts a memset before every stream-K kernel, a graph node that
    also keeps launch overlap from reaching the kernel.
    ``NVFP4_OPS_STREAMK_COUNTERS=per-call`` restores a fresh zeroed buffer per call.

    Raises:
        nvfp4_ops._env.NVFP4EnvError: the environment variable holds something else.
    """
    mode = _env.choice(STREAMK_COUNTERS_ENV, ("reuse", "per-call"), "reuse")
    stream = torch.cuda.current_stream(device)
    if mode == "reuse" and torch.cuda.is_current_stream_capturing():
        capture = _capture_id(stream.cuda_stream)
        key = None if capture is None else ("graph", capture, stream.cuda_stream, items)
        if key is not None and key not in _counters:
            # entries of earlier captures are no longer used: their graphs zero their own
            for old in [k for k in _counters if k[0] == "graph" and k[1] != capture]:
                del _counters[old]
    elif mode == "reuse":
        key = ("eager", device.index, stream.cuda_stream, items)
    else:
        key = None
    if key is None:
        return torch.zeros(items, dtype=torch.int32, device=device)
    buf = _counters.get(key)
    if buf is None:
        buf = _counters[key] = torch.zeros(items, dtype=torch.int32, device=device)
    return buf


def _capture_id(stream: int) -> int | None:
    """The process-unique id of the CUDA-graph capture the stream ``stream`` (a handle) is in;
    None if it cannot be told (then :func:`streamk_counters` zeroes a buffer per call)."""
    try:
        from cuda.bindings import runtime as rt

        err, status, capture = rt.cudaStreamGetCaptureInfo(stream)[:3]
    except Exception:  # no cuda-python, or an API it does not have
        return None
    if (err != rt.cudaError_t.cudaSuccess
            or status != rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive):
        return None
    return int(capture)


# ---------------------------------------------------------------------------- argument views


#: (kind, id of each argument) -> (weak references to the arguments, their signature, the
#: views built from them): :func:`memo_views`
_views: dict[tuple, tuple] = {}
_VIEWS_MAX = 4096


def memo_views(kind: str, tensors: tuple[torch.Tensor, ...],
               build: Callable[[], tuple]) -> tuple:
    """``build()`` (views of the weight arguments ``tensors``: 3-D weights, scale bytes as
    uint8, the kernels' global-scale views), reused while the same tensor objects come back
    with the same address and shape.

    Why: each view costs ~1-2 µs of host time on every eager call (``unsqueeze``, ``view``,
    ``expand``), and a layer's weights are the same objects call after call. An entry holds
    weak references: it goes when one of its tensors does; a tensor whose storage was swapped
    (``.data = ...``, ``set_``) or resized misses the signature (address, shape) and gets
    new views. Views of a contiguous tensor depend on nothing else: the op checked dtypes,
    device and contiguity before asking, and a dtype reinterpretation of the same bytes
    (float8 / uint8 scales) changes no view. The views hold their storage: a storage swapped
    out of a tensor stays allocated until that tensor's next call (which rebuilds its
    entry) or its end; weights prepared before the first call never pay this.
    """
    # no identity check needed: an entry goes the moment one of its tensors dies (the weak
    # references' callbacks run at deallocation), so a later object with a recycled id never
    # finds it; and the views hold their storage, so no other tensor has their address
    key = (kind, *map(id, tensors))
    sig = [(t.data_ptr(), t.shape) for t in tensors]
    hit = _views.get(key)
    if hit is not None and hit[1] == sig:
        return hit[2]
    views = tuple(_alias(v) for v in build())
    if len(_views) >= _VIEWS_MAX:
        _views.clear()
    refs = entry_refs(_views, key, tensors)
    _views[key] = (refs, sig, views)
    return views


def _alias(v):
    """A new tensor over ``v``'s storage (same offset, shape, strides) that is not a view of
    it (``detach``: no view base); non-tensors unchanged. Why: the memo must hold no
    reference to the argument tensors themselves, or its weak references would never die.
    ``v`` may be one of them (a 3-D weight is passed on as it is), and a view keeps its base's
    Python object alive (torch preserves it while the C++ tensor is referenced); a detached
    alias keeps only the storage (``tests/test_global_views.py`` checks both)."""
    return v.detach() if isinstance(v, torch.Tensor) else v


def kernel_weight(w: torch.Tensor, w_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight and its block scales as the binaries take them: 3-D ``[G, N, K/2]`` /
    ``[G, N, K/16]`` (a 2-D weight is one group), the scales as their uint8 bytes, both
    16-byte aligned (a copy where not)."""
    if w.dim() == 2:
        w, w_scale = w.unsqueeze(0), w_scale.unsqueeze(0)
    if w_scale.dtype != torch.uint8:
        w_scale = w_scale.view(torch.uint8)
    return _realigned(w), _realigned(w_scale)


def global_rows(scale: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The global scale of weight ``w`` (``[N, K/2]`` or ``[G, N, K/2]``) as the kernels'
    ``[G, 1, N]`` view: per row when it has a dimension less than ``w`` (``[N]`` / ``[G, N]``),
    else one per group (``[]`` / ``[G]``). A view, no copy: an expand-copy per call would cost a
    kernel."""
    n = w.shape[-2]
    if scale.dim() == w.dim() - 1:
        return per_row_global_view(scale, n)
    return per_group_global_view(scale, n)


def gated_kernel_weights(w13, w13_scale, w13_global, w2, w2_scale, w2_global) -> tuple:
    """A SwiGLU block's weights (``nvfp4::mlp``: one; ``nvfp4::moe``: one per expert) as its
    two GEMMs' binaries take them: :func:`kernel_weight` of each, with the gate/up global
    scales as the ``[G, 2, I]`` view (:func:`gate_up_global_view`) and the down one as
    :func:`global_rows`."""
    return (*kernel_weight(w13, w13_scale), gate_up_global_view(w13_global, w13.shape[-2] // 2),
            *kernel_weight(w2, w2_scale), global_rows(w2_global, w2))


# ---------------------------------------------------------------------------- the launcher


class _Unused(NamedTuple):
    """One-element stand-ins for the interface operands a launch does not use (int32
    ``tile_expert`` / ``tile_rows`` / ``counters``, fp32 ``row_scale`` / ``scratch``, bf16
    ``bias``), per device."""

    i32: torch.Tensor
    f32: torch.Tensor
    bf16: torch.Tensor


def _unused(device: torch.device) -> _Unused:
    t = _dummies.get(device.index)  # a CUDA tensor's device always has its index
    if t is None:
        t = _dummies[device.index] = _Unused(
            *(torch.zeros(1, dtype=d, device=device)
              for d in (torch.int32, torch.float32, torch.bfloat16)))
    return t


def _aligned(t: torch.Tensor, align: int = 16) -> torch.Tensor:
    return _realigned(t.contiguous(), align)


def _realigned(t: torch.Tensor, align: int = 16) -> torch.Tensor:
    """``t`` (contiguous), or a copy of it where its address is not ``align``-byte aligned."""
    return t if t.data_ptr() % align == 0 else t.clone()


def run_gemm(
    plan: GemmPlan,
    a: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    w_global: torch.Tensor,
    out: torch.Tensor,
    *,
    tile_expert: torch.Tensor | None = None,
    tile_rows: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    swiglu_limit: float | None = None,
    workspace: StreamKWorkspace | None = None,
    check: bool = True,
) -> None:
    """``out[p] = epilogue(a[p] @ (e2m1 * w_scale)[g]^T * w_global[g])`` for the token tile's
    group ``g``, with the kernel and config of ``plan``.

    Args:
        plan: from :mod:`nvfp4_ops.kernels.dispatch` for these sizes (its ``act_order`` is the
            order ``a`` must be in; its ``weight_order`` the order of ``w``).
        a: bf16 ``[P, K]`` (grouped: rows grouped by expert, each segment padded to the
            plan's ``block_m``).
        w: uint8 ``[G, N, K/2]`` (or ``[N, K/2]``); w_scale: float8_e4m3fn (or its uint8 view)
            ``[G, N, K/16]`` (or ``[N, K/16]``); for a plan with MXFP4 scales (``config.mx``)
            their UE8M0 bytes ``[G, N, K/32]``.
        w_global: fp32 global scale per weight row: the kernels' own ``[G, H2, N / H2]``
            (``H2 = 2`` for ``swiglu``), any strides, 0 included, passed as a view, never
            copied; with ``check`` also ``[G, N]`` (``[N]`` for one group).
        out: bf16 ``[P, N_out]``, preallocated; ``N_out = N/2`` for ``swiglu``.
        tile_expert: (grouped plans) int32 ``[ceil(P / block_m)]`` local group per token tile,
            ``-1`` = skip (its rows are not written).
        tile_rows: (grouped) int32 like ``tile_expert``: real rows at the start of each tile;
            the padding rows' outputs may be any function of the tile's rows. None = all real.
        row_scale: fp32 ``[P]`` (``row_scale`` epilogue); bias: bf16 ``[N]`` (``none``).
        swiglu_limit: ``L`` of ``silu(min(gate, L)) * clamp(up, -L, L)`` or None (no clamp).
        workspace: (stream-K plans) the counters and scratch; None = :func:`streamk_workspace`.
        check: check the arguments against the plan and bring them into the binaries' form
            (tools and tests). False: they are in it already, and nothing is checked or
            copied: ``a`` contiguous and 16-byte aligned, ``w`` / ``w_scale`` as
            :func:`kernel_weight` returns them, ``w_global`` the ``[G, H2, N / H2]`` view, the
            optional tensors contiguous and of the plan's dtypes. The ops pass False: they
            checked their arguments and build the weights' form once (:func:`memo_views`), and
            an eager call pays each host microsecond.

    Raises:
        ValueError: (``check``) wrong shapes or dtypes for the plan.
    """
    cfg = plan.config
    if check:
        if w.dim() == 2:
            w, w_scale = w.unsqueeze(0), w_scale.unsqueeze(0)
        w_global = _checked_global(cfg, a, w, w_scale, w_global, out, tile_expert, tile_rows,
                                   row_scale)
        a = _aligned(a)
        w, w_scale = kernel_weight(w.contiguous(), w_scale.contiguous())
        if tile_expert is not None:
            tile_expert = tile_expert.contiguous()
            tile_rows = tile_rows.contiguous() if tile_rows is not None else None
        if row_scale is not None:
            row_scale = row_scale.float().contiguous()
        if bias is not None:
            bias = bias.contiguous()
    num_rows = a.shape[0]
    if num_rows == 0:
        return
    dev = a.device
    unused = _unused(dev)
    counters, scratch = unused.i32, unused.f32
    if plan.streamk:
        if workspace is None:
            workspace = streamk_workspace(cfg, num_rows, dev)
        counters, scratch = workspace
    if tile_expert is not None and tile_rows is None:
        tile_rows = torch.full_like(tile_expert, cfg.block_m)
    _binary(plan)(a, w, w_scale, w_global, out,
                  *_operands_after_out(unused, tile_expert, tile_rows, row_scale, bias,
                                       counters, scratch, swiglu_limit))


def _operands_after_out(unused: _Unused, tile_expert, tile_rows, row_scale, bias, counters,
                        scratch, swiglu_limit) -> tuple:
    """The binaries' operands after ``out``, in their order, with the one-element stand-ins
    of ``unused`` for those a launch does not use (the one place that order is written)."""
    return (tile_expert if tile_expert is not None else unused.i32,
            tile_rows if tile_rows is not None else unused.i32,
            row_scale if row_scale is not None else unused.f32,
            bias if bias is not None else unused.bf16,
            counters, scratch,
            float("inf") if swiglu_limit is None else float(swiglu_limit))


def bound_gemm(plan: GemmPlan, w: torch.Tensor, w_scale: torch.Tensor, w_global: torch.Tensor,
               device: torch.device, *, bias: torch.Tensor | None = None,
               swiglu_limit: float | None = None) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """``run_gemm(plan, a, w, w_scale, w_global, out, bias=bias, swiglu_limit=swiglu_limit,
    check=False)`` as a function of ``(a, out)`` (a dense plan; the arguments already in the
    binaries' form), with the launch's other operands assembled once: what a kept eager
    launch calls (:func:`linear_launch`). Stream-K plans still get their workspace per call
    (:func:`run_gemm`)."""
    if plan.streamk or plan.config.grouped:
        return functools.partial(_gemm_into, plan, w, w_scale, w_global, bias, swiglu_limit)
    unused = _unused(device)
    weights = _kept_operands((w, w_scale, w_global), device)
    tail = _kept_operands(_operands_after_out(unused, None, None, None, bias, unused.i32,
                                              unused.f32, swiglu_limit), device)

    def gemm(a: torch.Tensor, out: torch.Tensor) -> None:
        _binary(plan)(a, *weights, out, *tail)

    return gemm


def _kept_operands(operands: tuple, device: torch.device) -> tuple:
    """``operands`` of a kept launch that it passes unchanged on every call: on CUDA its
    tensors as tvm-ffi tensors over the same memory, made once (other values as they are).

    Why: tvm-ffi converts each torch tensor argument at every call (~0.04 µs each on a CPU
    host, ``benchmarks/dev/host_path_cpu.py``: twelve torch tensors 1.00 µs, two torch and ten
    tvm-ffi tensors 0.62). Safe: the binary launches on the current stream of the first CUDA
    torch tensor among its arguments, and ``a`` (a torch tensor) comes first; the tvm-ffi
    tensors hold their torch tensors (views of the weights' storage, as the launch already
    did). On CPU (the tests' stand-in binaries, which compute with torch) nothing changes."""
    if device.type != "cuda":
        return operands
    import tvm_ffi

    return tuple(tvm_ffi.from_dlpack(t) if isinstance(t, torch.Tensor) else t
                 for t in operands)


def _gemm_into(plan, w, w_scale, w_global, bias, swiglu_limit, a, out) -> None:
    run_gemm(plan, a, w, w_scale, w_global, out, bias=bias, swiglu_limit=swiglu_limit,
             check=False)


#: id(plan) -> (plan, binary, lookup, memory-cache generation): a plan's binary without
#: hashing its config (a frozen dataclass of a dozen fields) on every launch. Checked with
#: ``is`` against the plan and the current :func:`compiled` (tools and tests replace it), and
#: dropped when the compile cache's memory is cleared.
_plan_binaries: dict[int, tuple[GemmPlan, object, object, int]] = {}


def _binary(plan: GemmPlan):
    hit = _plan_binaries.get(id(plan))
    generation = _compile.memory_generation()
    if hit is not None and hit[0] is plan and hit[2] is compiled and hit[3] == generation:
        return hit[1]
    fn = compiled(plan.config)
    _plan_binaries[id(plan)] = (plan, fn, compiled, generation)
    return fn


def _checked_global(cfg, a, w, w_scale, w_global, out, tile_expert, tile_rows,
                    row_scale) -> torch.Tensor:
    """:func:`run_gemm`'s argument check (``w`` / ``w_scale`` 3-D); returns ``w_global`` as the
    kernels' ``[G, H2, N / H2]`` view.

    Raises:
        ValueError: wrong shapes or dtypes for the config.
    """
    num_rows, k = a.shape
    groups, n, k_half = w.shape
    if ((n, k) != (cfg.n, cfg.k) or k_half * 2 != k
            or tuple(w_scale.shape) != (groups, n, k // cfg.scale_k)):
        raise ValueError(f"shape mismatch for the plan's N={cfg.n}, K={cfg.k}: a "
                         f"{tuple(a.shape)}, w {tuple(w.shape)}, w_scale {tuple(w_scale.shape)}")
    halves = _global_halves(cfg.epilogue)
    if w_global.dim() in (1, 2) and w_global.shape[-1] == n and n % halves == 0:
        w_global = per_row_global_view(w_global, n, halves)
    if (tuple(w_global.shape) != (groups, halves, n // halves)
            or w_global.dtype != torch.float32):
        raise ValueError(f"w_global must be fp32 [G, N] = [{groups}, {n}] or [G, H2, N/H2] = "
                         f"[{groups}, {halves}, {n // halves}] ({cfg.epilogue!r} epilogue), got "
                         f"{w_global.dtype} {tuple(w_global.shape)}")
    if a.dtype != torch.bfloat16 or out.dtype != torch.bfloat16 or w.dtype != torch.uint8:
        raise ValueError("a/out must be bf16 and w uint8")
    if out.shape[0] < num_rows or out.shape[1] != cfg.n_out or not out.is_contiguous():
        raise ValueError(f"out must be contiguous bf16 [>= {num_rows}, {cfg.n_out}]")
    if cfg.grouped != (tile_expert is not None):
        raise ValueError("grouped plans take tile_expert, dense plans do not")
    if cfg.epilogue == "row_scale" and (row_scale is None or row_scale.shape[0] < num_rows):
        raise ValueError("row_scale epilogue needs row_scale fp32 [P]")
    if tile_rows is not None and (tile_expert is None or tile_rows.dtype != torch.int32
                                  or tile_rows.shape != tile_expert.shape):
        raise ValueError("tile_rows must be int32 shaped like tile_expert (grouped calls only)")
    return w_global


# ---------------------------------------------------------------------------- the ops


def _order(wfrag: bool) -> WeightOrder:
    return WeightOrder.WFRAG if wfrag else WeightOrder.CHECKPOINT


def linear_launch(x, weight, weight_scale, global_scale, bias, wfrag=False
                  ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The CUDA launch of ``nvfp4::linear`` for ``x``'s sizes (arguments already validated by
    the op; ``wfrag``: ``weight`` prepared by ``nvfp4::to_wfrag_``): a function ``x -> bf16
    [M, N]`` for activations of ``x``'s dtype, shape and strides, which holds the plan and the
    weights' kernel-form views (not the weight tensors: their storage only); None where no
    kernel covers ``(N, K)`` (the op then runs the reference). The op keeps it for repeated
    calls (:class:`nvfp4_ops.ops._eager.Repeats`)."""
    num_tokens, k = x.shape
    n, device = weight.shape[0], x.device
    if num_tokens == 0:
        return lambda x: torch.empty((0, n), dtype=torch.bfloat16, device=device)
    plan = dispatch.plan_linear(n, k, num_tokens, has_bias=bias is not None,
                                order=_order(wfrag))
    if plan is None:
        return None
    w3, scale3, w_global = memo_views(
        "linear", (weight, weight_scale, global_scale),
        lambda: (*kernel_weight(weight, weight_scale), global_rows(global_scale, weight)))
    gemm = bound_gemm(plan, w3, scale3, w_global, device, bias=_alias(bias))
    graphs = _address_graphs((plan,), device, "nvfp4.linear")

    def launch(x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty((num_tokens, n))  # bf16 on x's device, as validated
        a = _realigned(x)
        if graphs is None:
            gemm(a, out)
        else:
            graphs.run((a, out), lambda: gemm(a, out))
        return out

    return launch


def _address_graphs(plans: tuple[GemmPlan, ...], device: torch.device,
                    what: str) -> eager_graphs.AddressGraphs | None:
    """The CUDA graphs that a kept launch of ``plans`` replays for calls whose activations and
    outputs sit at the addresses of an earlier call's
    (:class:`~nvfp4_ops.kernels.eager_graphs.AddressGraphs`; the plans, weights and scalars
    are the launch's own); None where the launch allocates per call (stream-K's workspace)
    or is not on CUDA."""
    if device.type != "cuda" or any(p.streamk or p.config.grouped for p in plans):
        return None
    return eager_graphs.AddressGraphs(device, what)


def linear(x, weight, weight_scale, global_scale, bias, wfrag=False):
    """:func:`linear_launch` run once: ``bf16 [M, N]``, or None where no kernel covers
    ``(N, K)``."""
    launch = linear_launch(x, weight, weight_scale, global_scale, bias, wfrag)
    return None if launch is None else launch(x)


def mlp_launch(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit,
               wfrag=False) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The CUDA launch of ``nvfp4::mlp`` for ``x``'s sizes and this ``swiglu_limit``, SwiGLU
    fused into the gate/up GEMM's epilogue (``wfrag``: both weights prepared by
    ``nvfp4::to_wfrag_``): a function ``x -> bf16 [M, H]`` as :func:`linear_launch`
    describes; None where no kernel covers ``(H, I)`` (the op then runs the reference)."""
    num_tokens, hidden = x.shape
    inter, device = w13.shape[0] // 2, x.device
    if num_tokens == 0:
        return lambda x: torch.empty((0, hidden), dtype=torch.bfloat16, device=device)
    plans = dispatch.plan_mlp(hidden, inter, num_tokens, order=_order(wfrag))
    if plans is None:
        return None
    gate_up, down = plans
    weights = (w13, w13_scale, w13_global, w2, w2_scale, w2_global)
    w13_3, s13_3, g13, w2_3, s2_3, g2 = memo_views(
        "mlp", weights, lambda: gated_kernel_weights(*weights))

    gemm1 = bound_gemm(gate_up, w13_3, s13_3, g13, device, swiglu_limit=swiglu_limit)
    gemm2 = bound_gemm(down, w2_3, s2_3, g2, device)
    graphs = _address_graphs(plans, device, "nvfp4.mlp")

    def gemms(a: torch.Tensor, act: torch.Tensor, out: torch.Tensor) -> None:
        gemm1(a, act)
        gemm2(act, out)

    def launch(x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty((num_tokens, hidden))  # bf16 on x's device, as validated
        act = x.new_empty((num_tokens, inter))
        a = _realigned(x)
        if graphs is None:
            gemms(a, act, out)
        else:
            graphs.run((a, act, out), lambda: gemms(a, act, out))
        return out

    return launch


def mlp(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit, wfrag=False):
    """:func:`mlp_launch` run once: ``bf16 [M, H]``, or None where no kernel covers
    ``(H, I)``."""
    launch = mlp_launch(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit,
                        wfrag)
    return None if launch is None else launch(x)


def run_once(plan: GemmPlan, device: torch.device | str = "cuda") -> None:
    """Launch ``plan`` once (warm-up: loads the module onto the device and runs it, so nothing
    is loaded lazily during CUDA-graph capture).

    The data is constant, made on the device: the values do not matter here, and random
    weights drawn on the host cost ~1-2 s over the ~70 variants of one V4 shape (a weight
    matrix of up to 8 MB per variant, then its copy), a large part of a warm start."""
    config = plan.config
    rows = config.block_m + 1
    a = torch.full((rows, config.k), 0.5, dtype=torch.bfloat16, device=device)
    w = torch.full((1, config.n, config.k // 2), 0x21, dtype=torch.uint8, device=device)
    # 1.0 as an e4m3 byte (0x38) or, for MXFP4 variants, as a UE8M0 one (127)
    one = 127 if config.scale_k == 32 else 0x38
    w_scale = torch.full((1, config.n, config.k // config.scale_k), one, dtype=torch.uint8,
                         device=device)
    # the shape every op passes for a per-tensor scale: a stride-0 view
    halves = _global_halves(config.epilogue)
    w_global = torch.ones((), dtype=torch.float32, device=device).expand(
        1, halves, config.n // halves)
    out = torch.empty(rows, config.n_out, dtype=torch.bfloat16, device=device)
    tiles = (rows + config.block_m - 1) // config.block_m
    tile_expert = (torch.zeros(tiles, dtype=torch.int32, device=device) if config.grouped
                   else None)
    row_scale = torch.ones(rows, device=device) if config.epilogue == "row_scale" else None
    bias = torch.zeros(config.n, dtype=torch.bfloat16, device=device) if config.has_bias else None
    run_gemm(plan, a, w, w_scale, w_global, out, tile_expert=tile_expert, row_scale=row_scale,
             bias=bias, swiglu_limit=10.0)
