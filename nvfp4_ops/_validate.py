"""Argument checks shared by every op, with errors that name the argument, what was expected
and what was seen.

Two levels:

* ``check_*_meta`` look only at shapes, dtypes and devices. They run in the op bodies *and*
  in the fakes, so a bad call fails the same way eagerly, under ``torch.compile`` and in
  export, before any kernel is launched.
* ``check_*_values`` read data (expert ids in range, global scales finite and positive).
  Reading a CUDA tensor is a host sync, so they are skipped while a CUDA graph is being
  captured, and can be switched off with ``NVFP4_OPS_VALUE_CHECKS=0`` (or
  :func:`set_value_checks`). Each check costs at most one sync, and global scales that
  passed once are not read again until modified. The kernels never trust them: ids outside
  the local range are dropped by the routing code, so a skipped check cannot crash a kernel.
"""

from __future__ import annotations

import os
import weakref

import torch

__all__ = [
    "NVFP4InputError",
    "set_value_checks",
    "value_checks_enabled",
    "check_codes_in_place",
    "check_linear_meta",
    "check_mlp_meta",
    "check_moe_meta",
    "check_global_scale_values",
    "check_topk_ids_values",
]

#: Block scales may come as float8_e4m3fn or as their raw bytes viewed as uint8 (the same
#: memory). The uint8 form exists because torch's SchemaCheckMode (opcheck's test_schema)
#: cannot compare float8 tensors on the CPU; kernels read the bytes either way.
SCALE_DTYPES = (torch.float8_e4m3fn, torch.uint8)

K_ALIGN = 32  # packed rows of K/2 bytes stay 16-byte multiples for K % 32 == 0

_value_checks = os.environ.get("NVFP4_OPS_VALUE_CHECKS", "1") not in ("0", "false", "off")


class NVFP4InputError(ValueError):
    """A bad argument to an nvfp4 op (wrong dtype, shape, device, alignment or value)."""


def set_value_checks(enabled: bool) -> None:
    """Turn the data-reading argument checks on or off (default: on)."""
    global _value_checks
    _value_checks = bool(enabled)


def value_checks_enabled(*tensors: torch.Tensor) -> bool:
    """Whether the data-reading checks should run for these tensors now."""
    if not _value_checks:
        return False
    if any(t.is_cuda for t in tensors) and torch.cuda.is_current_stream_capturing():
        return False
    return not any(t.device.type == "meta" for t in tensors)


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
    got = _shape(t)
    ok = len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want, strict=True))
    if not ok:
        concrete = tuple("*" if w is None else w for w in want)
        raise NVFP4InputError(f"{op}: {name} must have shape {what} = {concrete}, got {got}")


def expect_same_device(op: str, named: dict[str, torch.Tensor | None]) -> None:
    devices = {n: t.device for n, t in named.items() if t is not None}
    first_name, first = next(iter(devices.items()))
    for n, d in devices.items():
        if d != first:
            raise NVFP4InputError(
                f"{op}: all tensors must be on one device; {first_name} is on {first} "
                f"but {n} is on {d}"
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


def check_linear_meta(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    global_scale: torch.Tensor,
    bias: torch.Tensor | None,
    op: str = "nvfp4.linear",
) -> None:
    expect_dtype(op, "x", x, torch.bfloat16)
    if x.dim() != 2:
        raise NVFP4InputError(f"{op}: x must be 2-D [M, K], got shape {_shape(x)}")
    expect_dtype(op, "weight", weight, torch.uint8)
    expect_dtype(op, "weight_scale", weight_scale, *SCALE_DTYPES)
    expect_dtype(op, "global_scale", global_scale, torch.float32)
    k = x.shape[1]
    expect_k_aligned(op, "x", k, "K (x.shape[1])")
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
    returns the intermediate size I."""
    expect_dtype(op, "w13", w13, torch.uint8)
    expect_dtype(op, "w13_scale", w13_scale, *SCALE_DTYPES)
    expect_dtype(op, "w13_global", w13_global, torch.float32)
    expect_dtype(op, "w2", w2, torch.uint8)
    expect_dtype(op, "w2_scale", w2_scale, *SCALE_DTYPES)
    expect_dtype(op, "w2_global", w2_global, torch.float32)
    sym = "[E, " if lead else "["
    if w13.dim() != len(lead) + 2 or w13.shape[-2] % 2:
        raise NVFP4InputError(
            f"{op}: w13 must be uint8 {sym}2I, H/2] (gate rows then up rows), "
            f"got shape {_shape(w13)}"
        )
    inter = w13.shape[-2] // 2
    expect_shape(op, "w13", w13, (*lead, 2 * inter, hidden // 2), f"{sym}2I, H/2]")
    expect_shape(op, "w13_scale", w13_scale, (*lead, 2 * inter, hidden // 16), f"{sym}2I, H/16]")
    # global scales: one per half / tensor, or one per row (exact MXFP4 conversions)
    if w13_global.dim() == len(lead) + 1 and w13_global.shape[-1] == 2 * inter != 2:
        expect_shape(op, "w13_global", w13_global, (*lead, 2 * inter), f"{sym}2I] (per row)")
    else:
        expect_shape(op, "w13_global", w13_global, (*lead, 2),
                     f"{sym}2] (gate, up) or {sym}2I] (per row)")
    expect_k_aligned(op, "w13", 2 * inter, "2I (w13.shape[-2])")
    expect_k_aligned(op, "w2", inter, "I (w13.shape[-2] // 2)")
    expect_shape(op, "w2", w2, (*lead, hidden, inter // 2), f"{sym}H, I/2]")
    expect_shape(op, "w2_scale", w2_scale, (*lead, hidden, inter // 16), f"{sym}H, I/16]")
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
    expert_start: int,
    op: str = "nvfp4.moe",
) -> None:
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
    if expert_start < 0:
        raise NVFP4InputError(f"{op}: expert_start must be >= 0, got {expert_start}")
    named = dict(hidden=hidden, topk_ids=topk_ids, topk_weights=topk_weights, w13=w13,
                 w13_scale=w13_scale, w13_global=w13_global, w2=w2, w2_scale=w2_scale,
                 w2_global=w2_global)
    expect_same_device(op, named)
    expect_contiguous(op, named)


#: Global scales already found valid: id -> (weakref, data_ptr, version). Weights are static, so
#: after the first eager call a layer's scales cost no device read (and no host sync) again;
#: an in-place update bumps the version and re-checks, a freed tensor drops its entry.
_VERIFIED_SCALES: dict[int, tuple] = {}


def tensor_version(t: torch.Tensor) -> int | None:
    """``t._version``, or None for inference-mode tensors (they keep no version counter, so
    nothing keyed on their contents may be cached)."""
    try:
        return t._version
    except RuntimeError:
        return None


def _verified(t: torch.Tensor) -> bool:
    hit = _VERIFIED_SCALES.get(id(t))
    if hit is None or hit[0]() is not t:
        return False
    version = tensor_version(t)
    return version is not None and hit[1] == t.data_ptr() and hit[2] == version


def _mark_verified(t: torch.Tensor) -> None:
    version = tensor_version(t)
    if version is None:
        return
    key = id(t)
    ref = weakref.ref(t, lambda _: _VERIFIED_SCALES.pop(key, None))
    _VERIFIED_SCALES[key] = (ref, t.data_ptr(), version)


def check_global_scale_values(op: str, named: dict[str, torch.Tensor]) -> None:
    """Global scales must be finite and > 0 (a zero scale silently zeroes a layer).

    All tensors are checked with one device read (one host sync on CUDA); tensors that passed
    before and were not modified since are skipped (:data:`_VERIFIED_SCALES`).
    """
    todo = {
        name: t for name, t in named.items()
        if value_checks_enabled(t) and t.numel() > 0 and not _verified(t)
    }
    if not todo:
        return
    flags = [(~(torch.isfinite(t) & (t > 0))).any() for t in todo.values()]
    if bool(torch.stack(flags).any()):
        for name, t in todo.items():
            bad = ~(torch.isfinite(t) & (t > 0))
            if bool(bad.any()):
                idx = torch.nonzero(bad)[0].tolist()
                where = f" at index {tuple(idx)}" if idx else ""
                raise NVFP4InputError(
                    f"{op}: {name} must be finite and > 0, got {t[tuple(idx)].item()}{where} "
                    f"({int(bad.sum())} bad of {t.numel()})"
                )
    for t in todo.values():
        _mark_verified(t)


def check_topk_ids_values(op: str, topk_ids: torch.Tensor, num_global_experts: int) -> None:
    """Ids must be >= 0 and, when the global expert count is known (> 0), < that count.

    Ids outside this rank's local range are legal (another rank owns them); ids that no rank
    can own are a routing bug and raise.
    """
    if not value_checks_enabled(topk_ids) or topk_ids.numel() == 0:
        return
    lo, hi = torch.stack([topk_ids.min(), topk_ids.max()]).tolist()  # one host sync
    if lo < 0 or (num_global_experts > 0 and hi >= num_global_experts):
        bound = f"[0, {num_global_experts})" if num_global_experts > 0 else ">= 0"
        raise NVFP4InputError(
            f"{op}: topk_ids must be global expert ids in {bound}, got min {lo}, max {hi}"
        )
