"""Warm-up: compile (or load from the disk cache) and run once every GPU kernel a model can
reach, so that nothing compiles while a server captures CUDA graphs or serves requests.

A model is named by its layers' sizes (what the vLLM glue passes after loading) or, for the
DeepSeek-V4 shapes of :data:`nvfp4_ops.SHAPES`, by name:

.. code-block:: python

    nvfp4_ops.warmup(layers=[nvfp4_ops.LinearLayer(7168, 18432, wfrag=True),
                             nvfp4_ops.MoELayer(256, 4096, 2048, 6, wperm=True)])
    nvfp4_ops.warmup(["v4-flash"])

Every variant is found by the dispatch policy
(:func:`nvfp4_ops.kernels.dispatch.reachable_plans`) at every token count, so one warm-up
covers every batch size and expert-parallel split. With the guard on
(``NVFP4_OPS_NO_COMPILE_AFTER_WARMUP=1`` or :func:`nvfp4_ops._compile.set_no_compile_after_warmup`)
a later compile raises.

This module sits above the dispatch and the compile cache; importing it loads neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["LinearLayer", "MLPLayer", "MoELayer", "layers_for_shapes", "plans_for", "warmup"]


@dataclass(frozen=True)
class LinearLayer:
    """An ``nvfp4::linear`` of ``[n, k]`` weights; ``wfrag``: prepared by ``to_wfrag_``."""

    n: int
    k: int
    has_bias: bool = False
    wfrag: bool = False


@dataclass(frozen=True)
class MLPLayer:
    """An ``nvfp4::mlp`` (gate/up ``[2 inter, hidden]``, down ``[hidden, inter]``)."""

    hidden: int
    inter: int
    wfrag: bool = False


@dataclass(frozen=True)
class MoELayer:
    """An ``nvfp4::moe`` over ``experts`` local experts of ``(hidden, inter)``, top-``top_k``;
    ``wperm``: weights prepared by ``to_wperm_``; ``mx``: MXFP4 scales in the kernels' form
    (``float8_e8m0fnu``, :func:`nvfp4_ops.mxfp4_kernel_scales`)."""

    experts: int
    hidden: int
    inter: int
    top_k: int
    wperm: bool = False
    mx: bool = False


def layers_for_shapes(shapes: Iterable[str], *, include_moe: bool = True) -> list:
    """The layers of the named shapes in every weight order the glue may prepare: the shared
    expert (checkpoint order and ``wfrag``) and, with ``include_moe``, the routed experts
    (checkpoint order, and ``wperm`` where the MoE kernels read it; also ``wperm`` with MXFP4
    scales where the glue keeps DeepSeek's own checkpoints in that form on CUDA:
    :func:`nvfp4_ops.prepare.keeps_mxfp4_scales`).

    Raises:
        nvfp4_ops.NVFP4EnvError: ``NVFP4_OPS_MXFP4_SCALES`` holds something else.
    """
    from nvfp4_ops.prepare import keeps_mxfp4_scales
    from nvfp4_ops.shapes import get_shape

    layers: list = []
    for name in dict.fromkeys(shapes):
        s = get_shape(name)
        layers += [MLPLayer(s.hidden, s.shared_intermediate, wfrag)
                   for wfrag in (False, True)]
        if include_moe:
            layers.append(MoELayer(s.experts, s.hidden, s.intermediate, s.top_k))
            layers.append(MoELayer(s.experts, s.hidden, s.intermediate, s.top_k, wperm=True))
            if keeps_mxfp4_scales(s.hidden, s.intermediate, cuda=True):
                layers.append(MoELayer(s.experts, s.hidden, s.intermediate, s.top_k,
                                       wperm=True, mx=True))
    return layers


def plans_for(layers: Sequence) -> list:
    """Every GEMM plan the layers can launch (the dispatch's ``reachable_plans``)."""
    from nvfp4_ops.kernels import dispatch

    def order(prepared: bool, kind: dispatch.WeightOrder):
        return kind if prepared else dispatch.WeightOrder.CHECKPOINT

    wf = dispatch.WeightOrder.WFRAG
    moes = []
    for layer in layers:
        if isinstance(layer, MoELayer):
            if layer.wperm and not dispatch.moe_wperm_supported(layer.hidden, layer.inter):
                continue  # the op refuses these weights; nothing to warm
            if layer.mx and not dispatch.moe_mx_supported(layer.hidden, layer.inter):
                continue  # likewise
            moes.append((layer.hidden, layer.inter,
                         order(layer.wperm, dispatch.WeightOrder.WPERM), layer.mx))
    return dispatch.reachable_plans(
        linears=[(x.n, x.k, x.has_bias, order(x.wfrag, wf)) for x in layers
                 if isinstance(x, LinearLayer)],
        mlps=[(x.hidden, x.inter, order(x.wfrag, wf)) for x in layers
              if isinstance(x, MLPLayer)],
        moes=moes)


#: what ran on a CUDA device in this process: ``(device index, config name)`` -> the binary
#: that ran (a binary reloaded after the memory cache was cleared runs again), and
#: ``(device index, "triton", H, I, k)`` -> True; compile-only warm-ups record nothing
_ran: dict[tuple, object] = {}


def warmup(
    shapes: Iterable[str] | None = None,
    *,
    layers: Sequence | None = None,
    run: bool | None = None,
    include_moe: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[str]:
    """Compile (or load) every kernel variant the model can reach and run each once.

    Args:
        shapes: names from :data:`nvfp4_ops.SHAPES` (``"v4-flash"``, ``"v4-pro"``, ``"tiny"``);
            default ``["v4-flash"]`` when ``layers`` is not given either.
        layers: :class:`LinearLayer` / :class:`MLPLayer` / :class:`MoELayer` of the model.
        run: run each variant once on the current CUDA device (default: when CUDA is there).
        include_moe: with ``shapes``, also the routed experts.
        progress: called with one line per variant.

    Returns:
        The names of the variants warmed (CuTeDSL configs, then the MoE's Triton kernels when
        ``run``). With ``run``, variants that already ran on this device in this process are
        skipped and not listed, so warming layer after layer (as the vLLM glue does) costs
        nothing for sizes seen before. Afterwards the no-compile guard, if on, forbids
        compiles.

    Raises:
        ValueError: an unknown shape name or layer type.
    """
    import torch

    from nvfp4_ops import _compile

    if shapes is None and layers is None:
        shapes = ("v4-flash",)
    all_layers = list(layers or ()) + layers_for_shapes(shapes or (), include_moe=include_moe)
    for layer in all_layers:
        if not isinstance(layer, (LinearLayer, MLPLayer, MoELayer)):
            raise ValueError(f"warmup: layers must be LinearLayer, MLPLayer or MoELayer, got "
                             f"{type(layer).__name__}")
    if run is None:
        run = torch.cuda.is_available()
    if run:
        from nvfp4_ops._device import require_supported_gpu

        require_supported_gpu(torch.device("cuda", torch.cuda.current_device()))
    # warm-up is where compiles belong: a later warm-up (another layer, loaded after the
    # first one warmed) may compile even while the no-compile guard is on
    _compile.mark_warm(False)
    _compile.ensure_cutlass_env()
    from nvfp4_ops.kernels import linear_cuda

    names = []
    device = torch.cuda.current_device() if run else None
    plans = plans_for(all_layers)
    for i, plan in enumerate(plans):
        binary = linear_cuda.compiled(plan.config)  # a memory-cache hit when seen before
        if run:
            key = (device, plan.config.name)
            if _ran.get(key) is binary:
                continue  # this very binary already ran on this device
            linear_cuda.run_once(plan)
            _ran[key] = binary
        names.append(plan.config.name)
        if progress is not None:
            progress(f"[{i + 1}/{len(plans)}] {plan.config.name}{' (ran)' if run else ''}")
    if run:
        from nvfp4_ops.kernels import dispatch, moe_cuda

        for layer in all_layers:
            key = (device, "triton", layer.hidden, layer.inter, layer.top_k) if isinstance(
                layer, MoELayer) else None
            if key is None or key in _ran:
                continue
            _ran[key] = True
            tiles = dispatch.moe_act_orders(layer.hidden, layer.inter)
            triton_names = moe_cuda.warmup_triton(layer.hidden, layer.top_k, tiles)
            names += triton_names
            if progress is not None:
                progress(f"MoE Triton kernels H={layer.hidden} k={layer.top_k}: "
                         f"{len(triton_names)} variants (ran)")
        torch.cuda.synchronize()
    _compile.mark_warm(True)
    return names
