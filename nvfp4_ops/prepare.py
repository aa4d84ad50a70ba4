"""Load-time preparation of checkpoint weights for the ops: checked once, put in the order the
GPU kernels read fastest, in place (no second copy of any weight).

What the vLLM glue does after vLLM's loaders filled a layer's parameters, as plain functions
of tensors (so they are tested on the GPU without vLLM, and usable without it):

* :func:`prepare_linear`: a ModelOpt NVFP4 linear (possibly a fused projection of ``S``
  shards, each with its own ``weight_scale_2``): one fp32 global scale per output row, the
  codes in the ``wfrag`` order on CUDA;
* :func:`prepare_moe`: NVFP4 routed experts: the codes in the ``wperm`` bit order on CUDA where
  the MoE kernels read it;
* :func:`prepare_mxfp4_moe`: MXFP4 routed experts (DeepSeek's releases): the UE8M0 scales
  rebased into the form the MoE kernels read natively (:func:`nvfp4_ops.mxfp4_kernel_scales`;
  on CUDA where they cover the sizes) or converted exactly to NVFP4's
  (:func:`nvfp4_ops.mxfp4_to_nvfp4`), then as :func:`prepare_moe`.

Each returns the flag the op must then be called with (``wfrag=`` / ``wperm=``). ``None`` for
the order argument means "where it pays": on CUDA tensors (and, for the MoE, at sizes whose
kernels read the order at every token tile); ``True`` / ``False`` force it (on the CPU the
references undo the order exactly, so ``True`` is legal there too).
"""

from __future__ import annotations

import torch

from nvfp4_ops import _env
from nvfp4_ops import format as fmt
from nvfp4_ops._validate import NVFP4InputError, check_linear_weights, check_moe_weights
from nvfp4_ops.ops.mxfp4 import mxfp4_kernel_scales, mxfp4_to_nvfp4
from nvfp4_ops.ops.wfrag import to_wfrag_
from nvfp4_ops.ops.wperm import to_wperm_

__all__ = ["keeps_mxfp4_scales", "moe_mx_supported", "moe_wperm_supported", "prepare_linear",
           "prepare_moe", "prepare_mxfp4_moe"]


def moe_wperm_supported(hidden_size: int, inter: int) -> bool:
    """Whether the MoE's GPU kernels read ``wperm`` weights at every token tile for these
    sizes (V4-Flash and V4-Pro: yes). Pure function of the sizes; loads the kernel modules."""
    from nvfp4_ops.kernels.dispatch import moe_wperm_supported as supported

    return supported(hidden_size, inter)


def moe_mx_supported(hidden_size: int, inter: int) -> bool:
    """Whether the MoE's GPU kernels read MXFP4 scales natively (UE8M0 per 32 k) at every token
    tile for these sizes (``H`` and ``I`` multiples of 512; V4-Flash and V4-Pro: yes). Pure
    function of the sizes; loads the kernel modules."""
    from nvfp4_ops.kernels.dispatch import moe_mx_supported as supported

    return supported(hidden_size, inter)


def keeps_mxfp4_scales(hidden_size: int, inter: int, *, cuda: bool,
                       native: bool | None = None) -> bool:
    """Whether MXFP4 experts of these sizes are prepared in the kernels' native UE8M0 form
    (:func:`prepare_mxfp4_moe`) rather than converted to NVFP4 scales: ``native`` when given,
    else ``NVFP4_OPS_MXFP4_SCALES`` (``native`` / ``convert``), else (``auto``, the default) on
    CUDA wherever :func:`moe_mx_supported`. The warm-up and ``precompile`` include the ``mx``
    kernel variants by the same rule.

    Raises:
        nvfp4_ops.NVFP4EnvError: ``NVFP4_OPS_MXFP4_SCALES`` holds something else.
    """
    if native is None:
        native = _env.mxfp4_native()
    if native is None:  # auto: fewer scale bytes where the kernels read them
        return cuda and moe_mx_supported(hidden_size, inter)
    return native


def _contiguous_in_place(t: torch.Tensor, where: str, name: str) -> None:
    if not t.is_contiguous():
        raise NVFP4InputError(f"{where}: {name} must be contiguous to be prepared in place, got "
                              f"strides {t.stride()} for shape {tuple(t.shape)}")


def prepare_linear(weight: torch.Tensor, weight_scale: torch.Tensor,
                   shard_scales: torch.Tensor, shard_widths: list[int] | None = None, *,
                   wfrag: bool | None = None, where: str = "nvfp4.linear"
                   ) -> tuple[torch.Tensor, bool]:
    """Prepare one NVFP4 linear's weights for :func:`nvfp4_ops.linear`.

    Args:
        weight: ``uint8 [N, K/2]`` checkpoint codes, contiguous; reordered in place when
            ``wfrag`` applies.
        weight_scale: ``float8_e4m3fn [N, K/16]`` (or its bytes as ``uint8``).
        shard_scales: ``float32 [S]``: each shard's ``weight_scale_2`` (``[]`` for one shard,
            or ``[N]``: already one per row).
        shard_widths: the ``S`` shards' output rows, summing to ``N`` (None: one shard, or
            one scale per row).
        wfrag: put the codes in the ``wfrag`` order (None: on CUDA).
        where: prefix of error messages (the layer's name).

    Returns:
        ``(global_scale float32 [N], wfrag)``: the per-row global scales (each shard's own,
        never folded into the block scales) and the ``wfrag=`` flag for the op.

    Raises:
        NVFP4InputError: bad shapes, dtypes or devices, shard widths that do not sum to
            ``N``, or a bad scale (NaN or negative block scale, non-positive or non-finite
            global scale); all checked before anything is modified.
    """
    n = weight.shape[0]
    scales = shard_scales.reshape(-1).float()
    if shard_widths is None:  # one shard ([] or [1]), or already one scale per row ([N])
        widths = [1] * n if scales.numel() == n != 1 else [n]
    else:
        widths = list(shard_widths)
    if len(widths) != scales.numel() or sum(widths) != n:
        raise NVFP4InputError(f"{where}: {scales.numel()} shard scales for shard widths "
                              f"{widths}, which must be one per shard and sum to N = {n}")
    per_row = torch.repeat_interleave(
        scales, torch.tensor(widths, device=scales.device)).contiguous()
    check_linear_weights(weight, weight_scale, per_row, where=where)
    if wfrag is None:
        wfrag = weight.is_cuda
    if wfrag:
        _contiguous_in_place(weight, where, "weight")
        to_wfrag_(weight)
    return per_row, bool(wfrag)


def prepare_moe(w13: torch.Tensor, w13_scale: torch.Tensor, w13_global: torch.Tensor,
                w2: torch.Tensor, w2_scale: torch.Tensor, w2_global: torch.Tensor, *,
                wperm: bool | None = None, where: str = "nvfp4.moe") -> bool:
    """Check one MoE layer's NVFP4 experts (:func:`nvfp4_ops.check_moe_weights`) and, where it
    applies, permute their codes in place into the ``wperm`` bit order.

    Args:
        w13 ... w2_global: as :func:`nvfp4_ops.moe` takes them (global scales per expert half /
            per expert, or per row); ``w13`` and ``w2`` contiguous.
        wperm: put the codes in the ``wperm`` order (None: on CUDA where
            :func:`moe_wperm_supported`).
        where: prefix of error messages (the layer's name).

    Returns:
        The ``wperm=`` flag for :func:`nvfp4_ops.moe`.

    Raises:
        NVFP4InputError: as :func:`nvfp4_ops.check_moe_weights`, or ``wperm=True`` on CUDA at
            sizes whose kernels cannot read it; all checked before anything is modified.
    """
    check_moe_weights(w13, w13_scale, w13_global, w2, w2_scale, w2_global, where=where)
    hidden_size, inter = w2.shape[1], w13.shape[1] // 2
    if wperm is None:
        wperm = w13.is_cuda and moe_wperm_supported(hidden_size, inter)
    elif wperm and w13.is_cuda and not moe_wperm_supported(hidden_size, inter):
        raise NVFP4InputError(f"{where}: wperm weights at H={hidden_size}, I={inter} have no "
                              "kernel that reads them at every token tile; prepare with "
                              "wperm=False")
    if wperm:
        for name, t in (("w13", w13), ("w2", w2)):
            _contiguous_in_place(t, where, name)
        to_wperm_(w13)
        to_wperm_(w2)
    return bool(wperm)


def prepare_mxfp4_moe(w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                      w2_scale: torch.Tensor, *, wperm: bool | None = None,
                      native: bool | None = None, where: str = "nvfp4.moe",
                      names: tuple[str, str] = ("w13", "w2")):
    """Prepare one MoE layer's MXFP4 experts (e2m1 codes, one UE8M0 scale per 32 k) for
    :func:`nvfp4_ops.moe`, exactly: the scales kept one UE8M0 byte per 32 k in the form the
    MoE kernels read as they are (``native``, :func:`nvfp4_ops.mxfp4_kernel_scales`: 6 % fewer
    bytes per weight) or converted to NVFP4's (e4m3 per 16 k, :func:`nvfp4_ops.mxfp4_to_nvfp4`),
    with one fp32 global scale per row; the native form then takes one per expert half where
    the kernels' window holds the half (:func:`nvfp4_ops.format.mxfp4_group_globals`: every real
    checkpoint), which the kernels read once per CTA instead of once per row. The codes are
    NVFP4's already and stay in place. Then :func:`prepare_moe`.

    Args:
        w13: ``uint8 [E, 2I, H/2]``; w13_scale: UE8M0 bytes (``uint8`` or
            ``float8_e8m0fnu``) ``[E, 2I, H/32]``; w2: ``uint8 [E, H, I/2]``; w2_scale:
            ``[E, H, I/32]``.
        wperm, where: as :func:`prepare_moe`.
        native: keep UE8M0 scales; on CUDA this needs :func:`moe_mx_supported` sizes
            (V4-Flash and V4-Pro: yes). None: :func:`keeps_mxfp4_scales` (by default on CUDA
            tensors of those sizes; the CPU reference reads both forms, and gives bitwise the
            same result from either).
        names: how a conversion error names the two scale tensors (after ``where``), e.g.
            the parameter names of the caller's module.

    Returns:
        ``(w13_scale, w13_global f32 [E, 2I], w2_scale, w2_global f32 [E, H], wperm)`` (native
        and grouped: ``w13_global [E, 2]``, ``w2_global [E]``): the
        op's scale arguments (e4m3 ``[E, 2I, H/16]`` / ``[E, H, I/16]``, or ``native``
        ``float8_e8m0fnu [E, 2I, H/32]`` / ``[E, H, I/32]``) and its ``wperm=`` flag. The
        caller frees the checkpoint's UE8M0 tensors.

    Raises:
        NVFP4InputError: as :func:`nvfp4_ops.mxfp4_to_nvfp4` (a NaN scale, a row the form
            cannot hold exactly; named with ``where``, the tensor, the row and the block),
            ``native`` on CUDA at sizes whose kernels cannot read it, and :func:`prepare_moe`.
        nvfp4_ops.NVFP4EnvError: ``NVFP4_OPS_MXFP4_SCALES`` holds something else.
    """
    shaped = w13.dim() == w2.dim() == 3  # (bad shapes: named by the conversion below)
    hidden_size, inter = (w2.shape[1], w13.shape[1] // 2) if shaped else (0, 0)
    native = keeps_mxfp4_scales(hidden_size, inter, cuda=w13.is_cuda and shaped, native=native)
    if native and w13.is_cuda and shaped:
        if not moe_mx_supported(hidden_size, inter):
            raise NVFP4InputError(
                f"{where}: native MXFP4 scales at H={hidden_size}, I={inter} have no kernel "
                "that reads them at every token tile; prepare with native=False "
                "(NVFP4_OPS_MXFP4_SCALES=convert)")
    rescale = mxfp4_kernel_scales if native else mxfp4_to_nvfp4
    s13, g13 = rescale(w13, w13_scale, name=f"{where}: {names[0]}")
    s2, g2 = rescale(w2, w2_scale, name=f"{where}: {names[1]}")
    if native and shaped:
        # one global scale per expert half where the kernels' window holds the half
        s13, g13 = _per_half(w13, s13, g13, 2)
        s2, g2 = _per_half(w2, s2, g2, 1)
    flag = prepare_moe(w13, s13, g13, w2, s2, g2, wperm=wperm, where=where)
    return s13, g13, s2, g2, flag


def _per_half(w, scale, global_scale, halves):
    """``(scale, global_scale)`` with one global per expert half (``halves`` 2: w13's gate and
    up, ``[E, 2]``; 1: w2, ``[E]``: the op's forms), or unchanged where the kernels' window
    cannot hold a half (:func:`nvfp4_ops.format.mxfp4_group_globals`)."""
    grouped = fmt.mxfp4_group_globals(w, scale, global_scale, halves)
    if grouped is None:
        return scale, global_scale
    return grouped[0], grouped[1] if halves > 1 else grouped[1].squeeze(-1)
