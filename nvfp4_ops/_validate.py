"""Argument checks shared by every op, with errors that name the argument, what was expected
and what was seen. What is checked when depends on where the data lives:

* **Host data, every call** (free: no device access). Tensor metadata (dtypes, shapes,
  devices, contiguity, alignment: ``check_*_meta``) and the Python scalars of an op
  (``swiglu_limit``, ``output_scale``, ``expert_start``, ``global_num_experts``:
  :func:`check_swiglu_limit`, :func:`check_moe_scalars`). They run in the op bodies *and* in
  the fakes, so a bad call fails the same way eagerly, under ``torch.compile`` and in export,
  before any kernel is launched.
* **Weight data, once** (when weights are prepared or loaded): :func:`check_linear_weights`,
  :func:`check_mlp_weights` and :func:`check_moe_weights` check shapes, dtypes, one device,
  contiguity, e4m3 block scales (no NaN, none negative) and global scales (finite, > 0), with
  one host sync. The ops do not read weight data per call: call these after loading or
  after overwriting a weight (``.data`` writes included).
* **Per-call device data** (``topk_ids``, router weights) is never read by default: the
  kernels drop ids outside this rank's local expert range, so a bad id cannot crash a kernel
  (it contributes nothing). ``NVFP4_OPS_VALUE_CHECKS=1`` (or :func:`set_value_checks`) turns
  on debug checks that read device data on every eager call: ids in
  ``[0, global_num_experts)`` and the weights' scale values as above. Each costs a host sync,
  so they are skipped during CUDA-graph capture and on meta / fake tensors.
"""

from __future__ import annotations

import functools
import math

import torch

from nvfp4_ops import _env
from nvfp4_ops.format import MXFP4_KERNEL_SCALE_BYTES

__all__ = [
    "check_codes_in_place",
    "check_linear_meta",
    "check_linear_weights",
    "check_mlp_meta",
    "check_mlp_weights",
    "check_moe_meta",
    "check_moe_scalars",
    "check_moe_weights",
    "check_swiglu_limit",
    "check_topk_ids_values",
    "check_weight_values",
    "expect_dtype",
    "expect_same_device",
    "NVFP4InputError",
    "set_value_checks",
    "value_checks_enabled",
]

#: Block scales may come as float8_e4m3fn or as their raw bytes viewed as uint8 (the same
#: memory). The uint8 form exists because torch's SchemaCheckMode (opcheck's test_schema)
#: cannot compare float8 tensors on the CPU; kernels read the bytes either way.
SCALE_DTYPES = (torch.float8_e4m3fn, torch.uint8)
#: The MoE also takes MXFP4 block scales in the kernels' form: one UE8M0 byte per 32 k
#: (:func:`nvfp4_ops.format.mxfp4_kernel_scales`), told apart from NVFP4's by this dtype.
MX_SCALE_DTYPE = torch.float8_e8m0fnu
_MX_LO, _MX_HI = MXFP4_KERNEL_SCALE_BYTES

K_ALIGN = 32  # packed rows of K/2 bytes stay 16-byte multiples for K % 32 == 0

#: :func:`set_value_checks` override; None follows ``NVFP4_OPS_VALUE_CHECKS`` (default off).
_value_checks: bool | None = None


class NVFP4InputError(ValueError):
    """A bad argument to an nvfp4 op (wrong dtype, shape, device, alignment or value)."""


def set_value_checks(enabled: bool | None) -> None:
    """Turn the per-call debug checks that read device data on or off for this process
    (None: follow ``NVFP4_OPS_VALUE_CHECKS``, default off). See the module docstring."""
    global _value_checks
    _value_checks = None if enabled is None else bool(enabled)


def value_checks_override() -> bool | None:
    """The :func:`set_value_checks` override (None: ``NVFP4_OPS_VALUE_CHECKS`` decides)."""
    return _value_checks


def value_checks_on() -> bool:
    """Whether the per-call debug checks are switched on (whatever the tensors and the
    capture state; :func:`value_checks_enabled` adds those).

    Raises:
        nvfp4_ops._env.NVFP4EnvError: ``NVFP4_OPS_VALUE_CHECKS`` is not a boolean spelling.
    """
    return _env.flag(_env.VALUE_CHECKS, False) if _value_checks is None else _value_checks


def value_checks_enabled(*tensors: torch.Tensor) -> bool:
    """Whether the per-call debug checks should read these tensors now: switched on, none on
    ``meta``, and no CUDA graph being captured (a device read would sync inside it).

    Raises:
        nvfp4_ops._env.NVFP4EnvError: ``NVFP4_OPS_VALUE_CHECKS`` is not a boolean spelling.
    """
    if not value_checks_on() or any(t.device.type == "meta" for t in tensors):
        return False
    return not (any(t.is_cuda for t in tensors) and torch.cuda.is_current_stream_capturing())


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def expect_dtype(op: str, name: str, t: torch.Tensor, *dtypes: torch.dtype) -> None:
    if t.dtype not in dtypes:
        want = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise NVFP4InputError(
            f"{op}: {name} must be {want}, got {str(t.dtype).removeprefix('torch.')} "
            f"(shape {_shape(t)})"
        )


def expect_shape(op: str, name: str, t: torch.Tensor, want: tuple, what: str) -> None:
    """``want`` may hold ints or ``None`` (any size) per dim; ``what`` is the symbolic shape."""
    got = t.shape
    if got == want:  # the common case: one tuple comparison, no per-dim Python loop
        return
    if None in want and len(got) == len(want) and all(
            w is None or g == w for g, w in zip(got, want, strict=True)):
        return
    concrete = tuple("*" if w is None else w for w in want)
    raise NVFP4InputError(f"{op}: {name} must have shape {what} = {concrete}, got {tuple(got)}")


def expect_same_device(op: str, named: dict[str, torch.Tensor | None]) -> None:
    first_name = first = None
    for n, t in named.items():
        if t is None:
            continue
        if first is None:
            first_name, first = n, t.device
        elif t.device != first:
            raise NVFP4InputError(
                f"{op}: all tensors must be on one device; {first_name} is on {first} "
                f"but {n} is on {t.device}"
            )


def expect_contiguous(op: str, named: dict[str, torch.Tensor | None]) -> None:
    for n, t in named.items():
        if t is not None and not t.is_contiguous():
            raise NVFP4InputError(
                f"{op}: {n} must be contiguous (row-major), got strides {t.stride()} "
                f"for shape {_shape(t)}"
            )


def expect_k_aligned(op: str, name: str, k: int, what: str) -> None:
    if k <= 0 or k % K_ALIGN:
        raise NVFP4InputError(
            f"{op}: {what} = {k} must be a positive multiple of {K_ALIGN} "
            f"(16-element scale blocks, 16-byte rows); seen via {name}"
        )


# --- Python scalars: host checks, every call, op and fake -----------------------------------


def check_swiglu_limit(op: str, swiglu_limit: float | None) -> None:
    """``swiglu_limit`` is None or ``+inf`` (no clamp: the same result) or a number > 0.

    0 would zero every output and a negative limit makes ``clamp(up, -L, L)`` return ``-L``
    for every element; NaN poisons the output.

    Raises:
        NVFP4InputError: NaN, 0 or negative.
    """
    if swiglu_limit is not None and not swiglu_limit > 0:  # NaN fails every comparison
        raise NVFP4InputError(
            f"{op}: swiglu_limit must be > 0 (or None / inf for no clamp), got {swiglu_limit}"
        )


def check_moe_scalars(
    op: str,
    num_local_experts: int,
    expert_start: int,
    global_num_experts: int,
    swiglu_limit: float | None,
    output_scale: float,
) -> None:
    """The Python scalars of ``nvfp4::moe``: ``expert_start >= 0``; ``global_num_experts``
    -1 (unknown) or ``>= expert_start + E``; ``swiglu_limit`` as :func:`check_swiglu_limit`;
    ``output_scale`` finite.

    Raises:
        NVFP4InputError: any of these does not hold.
    """
    if expert_start < 0:
        raise NVFP4InputError(f"{op}: expert_start must be >= 0, got {expert_start}")
    if global_num_experts != -1:
        if global_num_experts <= 0:
            raise NVFP4InputError(
                f"{op}: global_num_experts must be > 0 (the experts over all ranks) or -1 "
                f"(unknown), got {global_num_experts}"
            )
        if expert_start + num_local_experts > global_num_experts:
            raise NVFP4InputError(
                f"{op}: expert_start + E = {expert_start} + {num_local_experts} exceeds "
                f"global_num_experts = {global_num_experts}"
            )
    check_swiglu_limit(op, swiglu_limit)
    if not math.isfinite(output_scale):
        raise NVFP4InputError(f"{op}: output_scale must be finite, got {output_scale}")


# --- tensor metadata: host checks, every call, op and fake ----------------------------------


def check_codes_in_place(op: str, w: torch.Tensor, byte_multiple: int, rule: str) -> None:
    """``w`` for an in-place reorder of packed FP4 codes (``nvfp4::to_wperm_`` /
    ``to_wfrag_``): uint8 ``[..., K/2]`` whose last dimension is a multiple of
    ``byte_multiple`` (``rule`` says it in the error), contiguous."""
    if w.dtype != torch.uint8 or w.dim() < 1 or w.shape[-1] % byte_multiple != 0:
        raise NVFP4InputError(
            f"{op}: w must be packed FP4 codes, uint8 [..., K/2] with {rule}, got {w.dtype} "
            f"{tuple(w.shape)}")
    if not w.is_contiguous():
        raise NVFP4InputError(f"{op}: w must be contiguous (permuted in place)")


def _check_linear_weights(
    op: str,
    k: int,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
) -> None:
    """dtypes and shapes of a dense layer's weights for input size ``k``."""
    expect_dtype(op, "weight", weight, torch.uint8)
    expect_dtype(op, "weight_scale", weight_scale, *SCALE_DTYPES)
    expect_dtype(op, "global_scale", global_scale, torch.float32)
    if weight.dim() != 2:
        raise NVFP4InputError(f"{op}: weight must be 2-D uint8 [N, K/2], got {_shape(weight)}")
    n = weight.shape[0]
    expect_shape(op, "weight", weight, (n, k // 2), "[N, K/2]")
    expect_shape(op, "weight_scale", weight_scale, (n, k // 16), "[N, K/16]")
    if global_scale.dim() != 0:
        expect_shape(op, "global_scale", global_scale, (n,), "[] or [N]")
    if bias is not None:
        expect_dtype(op, "bias", bias, torch.bfloat16)
        expect_shape(op, "bias", bias, (n,), "[N]")


def check_linear_meta(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
    op: str = "nvfp4.linear",
) -> None:
    """Metadata of an ``nvfp4::linear`` call (no data read; op and fake)."""
    if _linear_meta_ok(x, weight, weight_scale, global_scale, bias):
        return
    expect_dtype(op, "x", x, torch.bfloat16)
    if x.dim() != 2:
        raise NVFP4InputError(f"{op}: x must be 2-D [M, K], got shape {_shape(x)}")
    k = x.shape[1]
    expect_k_aligned(op, "x", k, "K (x.shape[1])")
    _check_linear_weights(op, k, weight, weight_scale, global_scale, bias)
    named = dict(x=x, weight=weight, weight_scale=weight_scale, global_scale=global_scale,
                 bias=bias)
    expect_same_device(op, named)
    expect_contiguous(op, named)


def _check_gated_weights(
    op: str,
    lead: tuple,
    hidden: int,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_global: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_global: torch.Tensor,
) -> int:
    """Checks gate/up + down weights with leading dims ``lead`` (``()`` or ``(E,)``);
    returns the intermediate size I. Experts (``lead``) may carry MXFP4 scales
    (:data:`MX_SCALE_DTYPE`, one per 32 k) instead of e4m3 ones, both tensors alike."""
    scale_dtypes = (*SCALE_DTYPES, MX_SCALE_DTYPE) if lead else SCALE_DTYPES
    expect_dtype(op, "w13", w13, torch.uint8)
    expect_dtype(op, "w13_scale", w13_scale, *scale_dtypes)
    expect_dtype(op, "w13_global", w13_global, torch.float32)
    expect_dtype(op, "w2", w2, torch.uint8)
    expect_dtype(op, "w2_scale", w2_scale, *scale_dtypes)
    expect_dtype(op, "w2_global", w2_global, torch.float32)
    mx = w13_scale.dtype == MX_SCALE_DTYPE
    if mx != (w2_scale.dtype == MX_SCALE_DTYPE):
        raise NVFP4InputError(
            f"{op}: w13_scale and w2_scale must both be e4m3 block scales (NVFP4: "
            f"float8_e4m3fn or uint8) or both {str(MX_SCALE_DTYPE).removeprefix('torch.')} "
            f"(MXFP4), got {str(w13_scale.dtype).removeprefix('torch.')} and "
            f"{str(w2_scale.dtype).removeprefix('torch.')}")
    sk = 32 if mx else 16
    sym = "[E, " if lead else "["
    if w13.dim() != len(lead) + 2 or w13.shape[-2] % 2:
        raise NVFP4InputError(
            f"{op}: w13 must be uint8 {sym}2I, H/2] (gate rows then up rows), "
            f"got shape {_shape(w13)}"
        )
    inter = w13.shape[-2] // 2
    expect_shape(op, "w13", w13, (*lead, 2 * inter, hidden // 2), f"{sym}2I, H/2]")
    expect_shape(op, "w13_scale", w13_scale, (*lead, 2 * inter, hidden // sk),
                 f"{sym}2I, H/{sk}]")
    # global scales: one per half / tensor, or one per row (exact MXFP4 conversions)
    if w13_global.dim() == len(lead) + 1 and w13_global.shape[-1] == 2 * inter != 2:
        expect_shape(op, "w13_global", w13_global, (*lead, 2 * inter), f"{sym}2I] (per row)")
    else:
        expect_shape(op, "w13_global", w13_global, (*lead, 2),
                     f"{sym}2] (gate, up) or {sym}2I] (per row)")
    expect_k_aligned(op, "w13", 2 * inter, "2I (w13.shape[-2])")
    expect_k_aligned(op, "w2", inter, "I (w13.shape[-2] // 2)")
    expect_shape(op, "w2", w2, (*lead, hidden, inter // 2), f"{sym}H, I/2]")
    expect_shape(op, "w2_scale", w2_scale, (*lead, hidden, inter // sk), f"{sym}H, I/{sk}]")
    if w2_global.dim() == len(lead) + 1:
        expect_shape(op, "w2_global", w2_global, (*lead, hidden), f"{sym}H] (per row)")
    else:
        expect_shape(op, "w2_global", w2_global, lead,
                     "[E] or [E, H] (per row)" if lead else "[] or [H] (per row)")
    return inter


def check_mlp_meta(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_global: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_global: torch.Tensor,
    op: str = "nvfp4.mlp",
) -> None:
    """Metadata of an ``nvfp4::mlp`` call (no data read; op and fake)."""
    expect_dtype(op, "x", x, torch.bfloat16)
    if x.dim() != 2:
        raise NVFP4InputError(f"{op}: x must be 2-D [M, H], got shape {_shape(x)}")
    expect_k_aligned(op, "x", x.shape[1], "H (x.shape[1])")
    _check_gated_weights(op, (), x.shape[1], w13, w13_scale, w13_global, w2, w2_scale,
                         w2_global)
    named = dict(x=x, w13=w13, w13_scale=w13_scale, w13_global=w13_global, w2=w2,
                 w2_scale=w2_scale, w2_global=w2_global)
    expect_same_device(op, named)
    expect_contiguous(op, named)


def check_moe_meta(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_global: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_global: torch.Tensor,
    op: str = "nvfp4.moe",
) -> None:
    """Metadata of an ``nvfp4::moe`` call (no data read; op and fake). The Python scalars
    are :func:`check_moe_scalars`'."""
    if _moe_meta_ok(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
                    w2_global):
        return
    expect_dtype(op, "hidden", hidden, torch.bfloat16)
    if hidden.dim() != 2:
        raise NVFP4InputError(f"{op}: hidden must be 2-D [T, H], got shape {_shape(hidden)}")
    expect_k_aligned(op, "hidden", hidden.shape[1], "H (hidden.shape[1])")
    expect_dtype(op, "topk_ids", topk_ids, torch.int32, torch.int64)
    expect_dtype(op, "topk_weights", topk_weights, torch.float32)
    if topk_ids.dim() != 2 or topk_ids.shape[0] != hidden.shape[0]:
        raise NVFP4InputError(
            f"{op}: topk_ids must be [T, k] with T = hidden.shape[0] = {hidden.shape[0]}, "
            f"got shape {_shape(topk_ids)}"
        )
    expect_shape(op, "topk_weights", topk_weights, _shape(topk_ids), "[T, k] (as topk_ids)")
    if w13.dim() != 3:
        raise NVFP4InputError(f"{op}: w13 must be uint8 [E, 2I, H/2], got shape {_shape(w13)}")
    _check_gated_weights(op, (w13.shape[0],), hidden.shape[1], w13, w13_scale, w13_global, w2,
                         w2_scale, w2_global)
    named = dict(hidden=hidden, topk_ids=topk_ids, topk_weights=topk_weights, w13=w13,
                 w13_scale=w13_scale, w13_global=w13_global, w2=w2, w2_scale=w2_scale,
                 w2_global=w2_global)
    expect_same_device(op, named)
    expect_contiguous(op, named)


# --- the fast path of the metadata checks ---------------------------------------------------
#
# An eager decode call is a few tens of µs of host time in all, and the detailed checks above
# (one helper per rule, each building its message's context) took ~15 µs of it for the MoE.
# The predicates below read each tensor's metadata once and answer whether a call has the
# common, valid form. True implies that every detailed check passes (tests/test_validation.py
# holds them to that for each way a check can fail); False only sends the call through the
# detailed checks, which raise with the message or pass (a valid form not covered here).

_IDS = (torch.int32, torch.int64)


def _same_device_contiguous(first: torch.Tensor, *rest: torch.Tensor | None) -> bool:
    device = first.device
    if not first.is_contiguous():
        return False
    for t in rest:
        if t is not None and (t.device != device or not t.is_contiguous()):
            return False
    return True


def _linear_meta_ok(x, weight, weight_scale, global_scale, bias) -> bool:
    if (x.dtype != torch.bfloat16 or weight.dtype != torch.uint8
            or weight_scale.dtype not in SCALE_DTYPES or global_scale.dtype != torch.float32
            or (bias is not None and bias.dtype != torch.bfloat16)):
        return False
    xs, ws = x.shape, weight.shape
    if len(xs) != 2 or len(ws) != 2:
        return False
    k, n = xs[1], ws[0]
    if k <= 0 or k % K_ALIGN or ws[1] * 2 != k or weight_scale.shape != (n, k // 16):
        return False
    if global_scale.dim() != 0 and global_scale.shape != (n,):
        return False
    if bias is not None and bias.shape != (n,):
        return False
    return _same_device_contiguous(x, weight, weight_scale, global_scale, bias)


def _moe_meta_ok(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global, w2, w2_scale,
                 w2_global) -> bool:
    if (hidden.dtype != torch.bfloat16 or topk_ids.dtype not in _IDS
            or topk_weights.dtype != torch.float32 or w13.dtype != torch.uint8
            or w2.dtype != torch.uint8 or w13_global.dtype != torch.float32
            or w2_global.dtype != torch.float32):
        return False
    if w13_scale.dtype == MX_SCALE_DTYPE and w2_scale.dtype == MX_SCALE_DTYPE:
        sk = 32
    elif w13_scale.dtype in SCALE_DTYPES and w2_scale.dtype in SCALE_DTYPES:
        sk = 16
    else:
        return False
    hs, ws, ids = hidden.shape, w13.shape, topk_ids.shape
    if len(hs) != 2 or len(ws) != 3 or len(ids) != 2:
        return False
    num_tokens, h = hs
    e, two_i, h_half = ws
    inter = two_i // 2
    if (h <= 0 or h % K_ALIGN or inter <= 0 or inter % K_ALIGN or two_i != 2 * inter
            or h_half * 2 != h or ids[0] != num_tokens or topk_weights.shape != ids):
        return False
    if (w13_scale.shape != (e, two_i, h // sk) or w2.shape != (e, h, inter // 2)
            or w2_scale.shape != (e, h, inter // sk)):
        return False
    g13, g2 = w13_global.shape, w2_global.shape
    if (g13 != (e, 2) and g13 != (e, two_i)) or (g2 != (e,) and g2 != (e, h)):
        return False
    return _same_device_contiguous(hidden, topk_ids, topk_weights, w13, w13_scale, w13_global,
                                   w2, w2_scale, w2_global)


# --- weight data: checked once, at load -----------------------------------------------------

#: Bytes of a tensor scanned per chunk: bounds the temporaries of a value check (a V4-Pro MoE
#: layer holds ~1 GiB of block scales) at a few times this, whatever the layer size.
_SCAN_BYTES = 64 << 20


def _block_scale_bad(b: torch.Tensor, mx: bool = False) -> torch.Tensor:
    """Bad e4m3 block-scale bytes: NaN (``0x7f`` / ``0xff``) or negative (sign bit set, other
    than ``-0`` = ``0x80``); zero is legal (an all-zero block). With ``mx``, UE8M0 bytes of
    the kernels' MXFP4 form outside ``[9, 135]`` (the NaN code 0xFF included)."""
    if mx:
        return (b < _MX_LO) | (b > _MX_HI)
    return (b == 0x7F) | (b > 0x80)


@functools.cache
def _e4m3_values() -> list[float]:
    """The value of every e4m3 byte (for error messages)."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()


def _global_bad(t: torch.Tensor) -> torch.Tensor:
    return ~(torch.isfinite(t) & (t > 0))


def _chunks(t: torch.Tensor):
    """(flat offset, flat slice) pieces of ``t`` of at most :data:`_SCAN_BYTES` each."""
    flat = t.reshape(-1) if t.is_contiguous() else t.flatten()
    step = max(1, _SCAN_BYTES // max(1, flat.element_size()))
    for start in range(0, flat.numel(), step):
        yield start, flat[start:start + step]


def _index(t: torch.Tensor, flat_index: int) -> tuple[int, ...]:
    idx = []
    for size in reversed(t.shape):
        idx.append(flat_index % size)
        flat_index //= size
    return tuple(reversed(idx))


def _raise_first_bad(op: str, name: str, t: torch.Tensor, block: bool) -> None:
    view = t.view(torch.uint8) if block else t
    mx = t.dtype == MX_SCALE_DTYPE
    total = 0
    first = None
    for start, chunk in _chunks(view):
        bad = _block_scale_bad(chunk, mx) if block else _global_bad(chunk)
        count = int(bad.sum())
        if count and first is None:
            first = start + int(torch.nonzero(bad)[0, 0])
        total += count
    if first is None:
        return
    idx = _index(t, first)
    where = f" at index {idx}" if idx else ""
    if block and mx:
        byte = int(view.reshape(-1)[first])
        seen = "NaN" if byte == 0xFF else f"2^{byte - 127}"
        raise NVFP4InputError(
            f"{op}: {name} must hold MXFP4 scales in the kernels' range 2^-118 .. 2^8 (UE8M0 "
            f"bytes {_MX_LO}..{_MX_HI}; nvfp4_ops.mxfp4_kernel_scales brings a checkpoint's "
            f"scales there), got {seen} (byte {byte:#04x}){where} ({total} bad of "
            f"{t.numel()})")
    if block:
        byte = int(view.reshape(-1)[first])
        seen = "NaN" if byte & 0x7F == 0x7F else f"{_e4m3_values()[byte]:g}"
        raise NVFP4InputError(
            f"{op}: {name} must hold e4m3 block scales >= 0 (no NaN), got {seen} (byte "
            f"{byte:#04x}){where} ({total} bad of {t.numel()})"
        )
    raise NVFP4InputError(
        f"{op}: {name} must be finite and > 0, got {t.reshape(-1)[first].item()}{where} "
        f"({total} bad of {t.numel()})"
    )


def check_weight_values(
    op: str,
    block_scales: dict[str, torch.Tensor],
    global_scales: dict[str, torch.Tensor],
) -> None:
    """Block scales (``float8_e4m3fn`` or their ``uint8`` bytes) hold no NaN and no negative
    value (``float8_e8m0fnu`` ones, MXFP4 in the kernels' form: bytes in ``[9, 135]``); global
    scales (fp32) are finite and > 0. One host sync when all pass (a second
    pass finds the first bad entry). Tensors on ``meta`` are skipped (they hold no data).

    Raises:
        NVFP4InputError: a bad entry, named with its index, value and the count of bad ones.
        RuntimeError: called while a CUDA graph is being captured (reading would sync).
    """
    tensors = [t for t in (*block_scales.values(), *global_scales.values())
               if t.device.type != "meta" and t.numel() > 0]
    if not tensors:
        return
    if any(t.is_cuda for t in tensors) and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{op}: weight values cannot be checked during CUDA-graph capture "
                           "(reading them syncs); check them when they are loaded")
    flags = []
    for t in block_scales.values():
        if t.device.type != "meta":
            mx = t.dtype == MX_SCALE_DTYPE
            flags += [_block_scale_bad(c, mx).any() for _, c in _chunks(t.view(torch.uint8))]
    for t in global_scales.values():
        if t.device.type != "meta":
            flags += [_global_bad(c).any() for _, c in _chunks(t)]
    if not flags or not bool(torch.stack([f.to(flags[0].device) for f in flags]).any()):
        return
    for name, t in global_scales.items():
        if t.device.type != "meta":
            _raise_first_bad(op, name, t, block=False)
    for name, t in block_scales.items():
        if t.device.type != "meta":
            _raise_first_bad(op, name, t, block=True)


def check_linear_weights(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    where: str = "nvfp4.linear",
) -> None:
    """Check a dense layer's NVFP4 weights once, when they are loaded or prepared (the ops
    check only their metadata per call).

    Args:
        weight: ``uint8 [N, K/2]`` packed e2m1 codes (checkpoint or ``wfrag`` order),
            ``K % 32 == 0``.
        weight_scale: ``float8_e4m3fn [N, K/16]`` (or its bytes as ``uint8``): no NaN, none
            negative.
        global_scale: ``float32 []`` or ``[N]``: finite and > 0.
        bias: optional ``bf16 [N]``.
        where: the prefix of error messages (e.g. the layer's name).

    All on one device, contiguous. Reads the scales: one host sync on CUDA.

    Raises:
        NVFP4InputError: wrong dtype, shape, device or contiguity; a bad scale value (named
            with its index).
    """
    expect_dtype(where, "weight", weight, torch.uint8)
    if weight.dim() != 2:
        raise NVFP4InputError(
            f"{where}: weight must be 2-D uint8 [N, K/2], got {_shape(weight)}")
    k = weight.shape[1] * 2
    expect_k_aligned(where, "weight", k, "K (weight.shape[1] * 2)")
    _check_linear_weights(where, k, weight, weight_scale, global_scale, bias)
    named = dict(weight=weight, weight_scale=weight_scale, global_scale=global_scale,
                 bias=bias)
    expect_same_device(where, named)
    expect_contiguous(where, named)
    check_weight_values(where, {"weight_scale": weight_scale}, {"global_scale": global_scale})


def _check_gated_weights_once(where, experts: bool, w13, w13_scale, w13_global, w2, w2_scale,
                              w2_global) -> None:
    """Weights-only form of the mlp (``experts=False``) / moe (True) checks, plus values."""
    expect_dtype(where, "w13", w13, torch.uint8)
    if w13.dim() != 2 + experts:
        sym = "[E, " if experts else "["
        raise NVFP4InputError(
            f"{where}: w13 must be uint8 {sym}2I, H/2], got shape {_shape(w13)}")
    lead = (w13.shape[0],) if experts else ()
    hidden = w13.shape[-1] * 2
    expect_k_aligned(where, "w13", hidden, "H (w13.shape[-1] * 2)")
    _check_gated_weights(where, lead, hidden, w13, w13_scale, w13_global, w2, w2_scale,
                         w2_global)
    named = dict(w13=w13, w13_scale=w13_scale, w13_global=w13_global, w2=w2,
                 w2_scale=w2_scale, w2_global=w2_global)
    expect_same_device(where, named)
    expect_contiguous(where, named)
    check_weight_values(where, {"w13_scale": w13_scale, "w2_scale": w2_scale},
                        {"w13_global": w13_global, "w2_global": w2_global})


def check_mlp_weights(
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_global: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_global: torch.Tensor,
    *,
    where: str = "nvfp4.mlp",
) -> None:
    """Check a gated MLP's NVFP4 weights (the layout of :func:`nvfp4_ops.mlp`) once, when
    they are loaded or prepared.

    Args:
        w13: ``uint8 [2I, H/2]`` (gate rows, then up rows); w13_scale: ``e4m3 [2I, H/16]``;
            w13_global: ``float32 [2]`` (gate, up) or ``[2I]`` (per row).
        w2: ``uint8 [H, I/2]``; w2_scale: ``e4m3 [H, I/16]``; w2_global: ``float32 []`` or
            ``[H]``. Block scales may be their bytes as ``uint8``.
        where: the prefix of error messages (e.g. the layer's name).

    ``H % 32 == 0`` and ``I % 32 == 0``; one device; contiguous; block scales without NaN or
    negative values; global scales finite and > 0. Reads the scales: one host sync on CUDA.

    Raises:
        NVFP4InputError: wrong dtype, shape, device or contiguity; a bad scale value.
    """
    _check_gated_weights_once(where, False, w13, w13_scale, w13_global, w2, w2_scale, w2_global)


def check_moe_weights(
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w13_global: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w2_global: torch.Tensor,
    *,
    where: str = "nvfp4.moe",
) -> None:
    """Check one MoE layer's NVFP4 expert weights (the layout of :func:`nvfp4_ops.moe`) once,
    when they are loaded or prepared (``nvfp4.moe`` checks only their metadata per call).

    Args:
        w13: ``uint8 [E, 2I, H/2]``; w13_scale: ``e4m3 [E, 2I, H/16]``; w13_global:
            ``float32 [E, 2]`` (gate, up) or ``[E, 2I]`` (per row).
        w2: ``uint8 [E, H, I/2]``; w2_scale: ``e4m3 [E, H, I/16]``; w2_global:
            ``float32 [E]`` or ``[E, H]``. Block scales may be their bytes as ``uint8``, or
            MXFP4 scales in the kernels' form (both ``float8_e8m0fnu``, ``[E, 2I, H/32]`` /
            ``[E, H, I/32]``, bytes in ``[9, 135]``: :func:`nvfp4_ops.mxfp4_kernel_scales`).
        where: the prefix of error messages (e.g. the layer's name).

    ``H % 32 == 0`` and ``I % 32 == 0``; one device; contiguous; block scales without NaN or
    negative values; global scales finite and > 0. Reads the scales: one host sync on CUDA.

    Raises:
        NVFP4InputError: wrong dtype, shape, device or contiguity; a bad scale value.
    """
    _check_gated_weights_once(where, True, w13, w13_scale, w13_global, w2, w2_scale,
                              w2_global)


# --- per-call device data: opt-in debug checks ----------------------------------------------


def check_topk_ids_values(op: str, topk_ids: torch.Tensor, num_global_experts: int) -> None:
    """Ids must be >= 0 and, when the global expert count is known (> 0), < that count.
    Reads ``topk_ids`` (one host sync on CUDA): the ops call it only when
    :func:`value_checks_enabled`.

    Ids outside this rank's local range are legal (another rank owns them); ids that no rank
    can own are a routing bug and raise.

    Raises:
        NVFP4InputError: an id outside ``[0, num_global_experts)``.
    """
    if topk_ids.numel() == 0:
        return
    lo, hi = torch.stack([topk_ids.min(), topk_ids.max()]).tolist()  # one host sync
    if lo < 0 or (num_global_experts > 0 and hi >= num_global_experts):
        bound = f"[0, {num_global_experts})" if num_global_experts > 0 else ">= 0"
        raise NVFP4InputError(
            f"{op}: topk_ids must be global expert ids in {bound}, got min {lo}, max {hi}"
        )
