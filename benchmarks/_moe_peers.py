"""The MoE implementations ``bench_moe.py`` times beside ``nvfp4::moe``, on the same routing.

* :class:`HummingMoE`: Humming's NVFP4 / MXFP4 MoE (``humming-kernels`` 0.1.19, what vLLM 0.33
  tries first on SM90), with the weights converted and the GEMMs called as vLLM's Humming
  experts convert and call them (``indexed`` without expert parallelism, ``grouped_contiguous``
  with it: :func:`humming_gemm_type`), then a weighted top-k sum (:func:`weighted_topk_sum`).
  Its routing metadata is built outside the timed call.
* :class:`Bf16GroupedMoE`: the same MoE with bf16 weights and ``torch._grouped_mm``.

``bench_moe.py``'s module docstring states what each one includes and the asymmetries.
"""

from __future__ import annotations

import json
import math
import os

import torch

from nvfp4_ops.shapes import MoEShape
from nvfp4_ops.testing import align_block_routing, contiguous_routing, humming_tuning_subset

__all__ = ["Bf16GroupedMoE", "HummingMoE", "humming_gemm_type", "humming_modules",
           "weighted_topk_sum"]


def humming_gemm_type(choice: str, ep: int) -> str:
    """vLLM 0.33's choice (``get_humming_moe_gemm_type``): ``grouped_contiguous`` under expert
    parallelism, ``indexed`` otherwise; ``--humming-gemm`` forces one."""
    if choice == "auto":
        return "grouped_contiguous" if ep > 1 else "indexed"
    return {"indexed": "indexed", "grouped": "grouped_contiguous"}[choice]


_COMBINE_KERNEL = None


def weighted_topk_sum(rows: torch.Tensor, row_index: torch.Tensor, topk_weights: torch.Tensor,
                      out: torch.Tensor) -> torch.Tensor:
    """``out[t] = bf16(sum_j topk_weights[t, j] * rows[row_index[t, j]])`` in fp32, slots with
    ``row_index < 0`` skipped: one Triton launch, the work of vLLM's ``moe_fused_mul_sum``
    (indexed) and ``moe_unpermute`` (grouped) after Humming's GEMMs.

    ``rows bf16 [R, H]``, ``row_index int32 [T, k]``, ``topk_weights fp32 [T, k]``,
    ``out bf16 [T, H]`` (returned).
    """
    global _COMBINE_KERNEL
    import triton
    import triton.language as tl

    if _COMBINE_KERNEL is None:
        @triton.jit
        def _kernel(rows_ptr, index_ptr, weight_ptr, out_ptr, hidden, top_k: tl.constexpr,
                    block: tl.constexpr):
            token = tl.program_id(0)
            cols = tl.program_id(1) * block + tl.arange(0, block)
            in_row = cols < hidden
            acc = tl.zeros([block], dtype=tl.float32)
            for j in tl.static_range(top_k):
                row = tl.load(index_ptr + token * top_k + j)
                weight = tl.load(weight_ptr + token * top_k + j)
                src = rows_ptr + tl.maximum(row, 0).to(tl.int64) * hidden + cols
                acc += tl.load(src, mask=in_row & (row >= 0), other=0.0).to(tl.float32) * weight
            tl.store(out_ptr + token.to(tl.int64) * hidden + cols, acc.to(tl.bfloat16),
                     mask=in_row)

        _COMBINE_KERNEL = _kernel
    num_tokens, top_k = row_index.shape
    hidden = rows.shape[1]
    block = 1024
    if num_tokens:
        _COMBINE_KERNEL[(num_tokens, triton.cdiv(hidden, block))](
            rows, row_index, topk_weights, out, hidden, top_k=top_k, block=block)
    return out


class Bf16GroupedMoE:
    """The bf16 baseline: bf16 weights (random, same sizes) for experts
    ``[expert_start, expert_start + E)``, ``torch._grouped_mm``; routing, gather and combine
    in torch inside the timed call. Other ranks' slots sort last and are masked out."""

    def __init__(self, shape: MoEShape, num_experts: int, expert_start: int, device: str,
                 seed: int, weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        h, i = shape.hidden, shape.intermediate
        if weights is None:
            gen = torch.Generator(device=device).manual_seed(seed)
            # [E, N, K] contiguous, passed transposed ([E, K, N], K-major) as _grouped_mm wants;
            # filled a few experts at a time (an fp32 randn of all V4-Pro experts is 67 GB)
            w13 = torch.empty(num_experts, 2 * i, h, dtype=torch.bfloat16, device=device)
            w2 = torch.empty(num_experts, h, i, dtype=torch.bfloat16, device=device)
            for e0 in range(0, num_experts, 16):
                e1 = min(num_experts, e0 + 16)
                w13[e0:e1] = torch.randn(e1 - e0, 2 * i, h, device=device,
                                         generator=gen) / math.sqrt(h)
                w2[e0:e1] = torch.randn(e1 - e0, h, i, device=device,
                                        generator=gen) / math.sqrt(i)
            weights = (w13, w2)
        self.w13, self.w2 = weights
        self.num_experts = num_experts
        self.expert_start = expert_start
        self.all_local = expert_start == 0 and num_experts == shape.experts
        self.inter = i
        self.limit = shape.swiglu_limit

    def slice(self, shape: MoEShape, start: int, num_experts: int) -> Bf16GroupedMoE:
        """The experts ``[start, start + num_experts)`` of this (all-expert) baseline, as views."""
        return Bf16GroupedMoE(shape, num_experts, start, str(self.w13.device), 0,
                              (self.w13[start:start + num_experts],
                               self.w2[start:start + num_experts]))

    def __call__(self, hidden, topk_ids, topk_weights):
        num_tokens, top_k = topk_ids.shape
        flat = topk_ids.reshape(-1).long() - self.expert_start
        local = (flat >= 0) & (flat < self.num_experts)
        key = flat if self.all_local else torch.where(local, flat, self.num_experts)
        order = torch.argsort(key, stable=True)
        counts = torch.zeros(self.num_experts + 1, dtype=torch.int32, device=hidden.device)
        counts.scatter_add_(0, key, torch.ones_like(key, dtype=torch.int32))
        offs = torch.cumsum(counts[:-1], 0, dtype=torch.int32)
        token = order // top_k
        x = hidden.index_select(0, token)
        gate_up = torch._grouped_mm(x, self.w13.transpose(1, 2), offs=offs)
        gate = gate_up[:, :self.inter].float().clamp(max=self.limit)
        up = gate_up[:, self.inter:].float().clamp(-self.limit, self.limit)
        act = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
        y = torch._grouped_mm(act, self.w2.transpose(1, 2), offs=offs)
        y = y.float() * topk_weights.reshape(-1)[order].unsqueeze(1)
        if not self.all_local:  # rows past the last local offset are never written
            y = torch.where(local[order].unsqueeze(1), y, 0.0)
        out = torch.zeros(num_tokens, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        out.index_add_(0, token, y)
        return out.to(torch.bfloat16)


_HUMMING: dict | None = None


def humming_modules() -> dict | None:
    """Humming's pieces vLLM 0.33 calls, imported once; None (after one clear line) when
    ``humming`` is not importable."""
    global _HUMMING
    if _HUMMING is not None:
        return _HUMMING or None
    try:
        import humming
        from humming.config import GemmType
        from humming.forward import humming_forward, may_process_input
        from humming.schema import HummingInputSchema, Mxfp4WeightSchema
        from humming.schema.modelopt import ModeloptNvfp4WeightSchema
        from humming.transform import prepare_and_transform_humming_tensors
        from humming.tune import get_heuristics_config
    except Exception as exc:  # noqa: BLE001 - any import failure means: no Humming columns
        print(f"humming-kernels not importable: {type(exc).__name__}: {exc}; Humming columns "
              "skipped", flush=True)
        _HUMMING = {}
        return None
    _HUMMING = dict(version=getattr(humming, "__version__", "?"), GemmType=GemmType,
                    humming_forward=humming_forward, may_process_input=may_process_input,
                    HummingInputSchema=HummingInputSchema, Mxfp4WeightSchema=Mxfp4WeightSchema,
                    ModeloptNvfp4WeightSchema=ModeloptNvfp4WeightSchema,
                    prepare=prepare_and_transform_humming_tensors,
                    get_heuristics_config=get_heuristics_config)
    _humming_environment()
    return _HUMMING


def _humming_environment() -> None:
    """Print how Humming will JIT-compile (NVRTC through its bundled ``nvrtc_compile`` helper,
    or nvcc), from which CUDA environment and into which cache; make sure NVRTC finds its
    builtins library (it loads ``libnvrtc-builtins`` by name, so its folder must be on
    ``LD_LIBRARY_PATH`` of the compile subprocesses)."""
    try:
        from humming.jit.runtime import KernelRuntime
        from humming.utils.jit import get_humming_cache_dir
        from humming.utils.nvrtc import _find_nvrtc_lib_dir

        lib_dir, lib_path, env = _find_nvrtc_lib_dir()
        paths = os.environ.get("LD_LIBRARY_PATH", "").split(":")
        if lib_dir and lib_dir not in paths:
            os.environ["LD_LIBRARY_PATH"] = ":".join([lib_dir, *[p for p in paths if p]])
        print(f"humming {_HUMMING['version']}: compiler {KernelRuntime._get_compiler().__name__}"
              f", CUDA env {env['path']} ({env['source']}), nvrtc {lib_path}, cache "
              f"{get_humming_cache_dir()}", flush=True)
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        print(f"humming: environment probe failed ({type(exc).__name__}: {exc})", flush=True)


def clamped_swiglu_impl(limit: float, alpha: float = 1.0, beta: float = 0.0) -> str:
    """The C++ expression Humming's input-processing kernel evaluates per (gate ``a``, up
    ``b``) pair of a ``binary_split`` activation: vLLM 0.33 passes SwiGLU with
    ``gate = min(a, L)``, ``up = clamp(b, -L, L)``, ``silu(alpha * gate) * (up + beta)`` for
    DeepSeek-V4's ``SiluAndMul`` with ``swiglu_limit`` (alpha 1, beta 0), the clamp ours
    applies."""
    lim, a_, b_ = (f"({float(v)}f)" for v in (limit, alpha, beta))
    return ("[](float a, float b) { const float gate = fminf(a, " + lim + "); "
            "const float up = fmaxf(fminf(b, " + lim + "), -" + lim + "); "
            "return gate / (1.f + expf(-" + a_ + " * gate)) * (up + " + b_ + "); }(a, b)")


class HummingMoE:
    """Humming's MoE for one EP slice, built and run as vLLM 0.33 builds and runs it.

    Weights (``convert_to_humming_moe_kernel_format``): the checkpoint tensors of each of w13
    and w2 go through the format's Humming schema (``ModeloptNvfp4WeightSchema`` for NVFP4 -
    ``weight`` uint8 [E, N, K/2], ``weight_scale`` e4m3 [E, N, K/16], ``weight_scale_2`` fp32
    [E, 2] (w13) / [E] (w2); ``Mxfp4WeightSchema`` for MXFP4 - ``weight``, ``weight_scale``
    UE8M0 bytes [E, N, K/32], e2m1 / e8m0 group 32), then
    ``prepare_and_transform_humming_tensors`` (N padded to 256, K to 128, bf16 params, bf16
    activations: the default input schema). vLLM hands Humming the layer's ``[E, 2]``
    ``w13_weight_scale_2`` as loaded: with equal gate and up scales (ModelOpt's exports; the
    benchmark's weights) Humming keeps one fp32 tensor scale per expert; with different ones
    it would switch to per-channel scales in bf16 (rounded). vLLM's other NVFP4 backends use
    column 0 for both halves; ours applies both, exactly.

    Call (``HummingIndexedExperts.apply`` / ``HummingGroupedExperts.apply``): indexed - GEMM 1
    reads the token rows through block-aligned sorted ids (top_k = k), the activation kernel
    writes ``act [T k, I]``, GEMM 2 (top_k = 1), weighted sum over the slots; grouped - the
    input kernel scatters the token rows into expert order, both GEMMs walk expert offsets,
    weighted sum through the scatter index. The routing metadata (:meth:`prepare`) is
    computed outside the timed call (the asymmetry of the module docstring). The kernels'
    tuning lists are vLLM's (``get_heuristics_config``), cut to the entries the planned token
    counts select: Humming compiles every entry of a list on first use, and a cut list picks
    the same entry, hence the same kernel, for those counts.
    """

    def __init__(self, shape: MoEShape, fmt: str, tensors: dict[str, torch.Tensor], *,
                 expert_start: int, local_experts: int, gemm_type: str,
                 token_counts: list[int], device: str) -> None:
        hm = humming_modules()
        if hm is None:
            raise RuntimeError("humming-kernels not importable")
        self.hm = hm
        self.shape = shape
        self.local_experts = local_experts
        self.expert_start = expert_start
        self.gemm_type = gemm_type
        self.device = device
        h, i = shape.hidden, shape.intermediate
        schema = (hm["ModeloptNvfp4WeightSchema"]() if fmt == "nvfp4"
                  else hm["Mxfp4WeightSchema"]())
        sublayers = {"w13": (2 * i, h, [i, i]), "w2": (h, i, [h])}
        self.config, self.weights, self.hadamard, self.tuning = {}, {}, {}, {}
        self.compute = json.dumps({"use_batch_invariant": False, "use_f16_accum": False,
                                   "gemm_type": gemm_type})
        valid_ms = sorted({self.valid_shape_m(t) for t in token_counts})
        for name, (n, k, n_stacks) in sublayers.items():
            src = {"weight": tensors[name], "weight_scale": tensors[f"{name}_scale"]}
            if fmt == "nvfp4":
                src["weight_scale_2"] = tensors[f"{name}_global"]
            w_schema, conv = schema.convert_humming(src, n_stacks, [k], torch.bfloat16,
                                                    local_experts)
            in_schema, in_tensors = hm["HummingInputSchema"]().convert_humming(
                src, n_stacks, [k], torch.bfloat16, local_experts)
            conv.update(in_tensors)
            cfg, out = hm["prepare"](tensors=conv, shape_n=n, shape_k=k, pad_n_to_multiple=256,
                                     pad_k_to_multiple=128, input_schema=in_schema,
                                     weight_schema=w_schema, has_bias=False,
                                     num_experts=local_experts, torch_dtype=torch.bfloat16,
                                     device=device)
            # Humming's tensors must own their storage: ours are permuted in place later
            inputs = {t.untyped_storage().data_ptr() for t in src.values()}
            out = {key: (t.clone() if t.untyped_storage().data_ptr() in inputs else t)
                   for key, t in out.items()}
            self.config[name], self.weights[name] = cfg, out
            self.hadamard[name] = w_schema.hadamard_block_size
            full = hm["get_heuristics_config"](layer_config=cfg, use_f16_accum=False,
                                               use_batch_invariant=False,
                                               gemm_type=hm["GemmType"](gemm_type))
            picked = humming_tuning_subset(full, valid_ms)
            self.tuning[name] = (json.dumps(picked), picked, len(full))
        # the bench stops calling it after two failures before any success
        self.succeeded, self.failures, self.disabled = False, 0, None
        self.locks = torch.zeros(torch.cuda.get_device_properties(device).multi_processor_count
                                 * 8, dtype=torch.int32, device=device)
        self.activation = clamped_swiglu_impl(shape.swiglu_limit)

    def describe(self) -> str:
        return ", ".join(f"{name}: {len(picked)} of {n} tuning entries"
                         for name, (_, picked, n) in self.tuning.items())

    def valid_shape_m(self, num_tokens: int) -> int:
        """vLLM's ``estimate_local_valid_shape_m``: the local share of the routed rows."""
        return math.ceil(num_tokens * self.shape.top_k * self.local_experts / self.shape.experts)

    def _block_m(self, name: str, valid_m: int) -> int:
        for lo, hi, cfg in self.tuning[name][1]:
            if lo < valid_m <= hi:
                return cfg["block_shape"][0]
        return 64  # vLLM's default when no entry matches

    def prepare(self, topk_ids: torch.Tensor) -> dict:
        """Routing metadata and buffers for one routing (outside any timed graph)."""
        num_tokens, top_k = topk_ids.shape
        h, i = self.shape.hidden, self.shape.intermediate
        slots = num_tokens * top_k
        dev = topk_ids.device
        meta = {"valid_m": self.valid_shape_m(num_tokens), "tokens": num_tokens,
                "gate_up": torch.empty(slots, 2 * i, dtype=torch.bfloat16, device=dev),
                "act": torch.empty(slots, i, dtype=torch.bfloat16, device=dev),
                "down": torch.empty(slots, h, dtype=torch.bfloat16, device=dev),
                "out": torch.empty(num_tokens, h, dtype=torch.bfloat16, device=dev)}
        rng = {"expert_start": self.expert_start, "local_experts": self.local_experts}
        if self.gemm_type == "indexed":
            for name in ("w13", "w2"):
                meta[name] = align_block_routing(topk_ids, self._block_m(name, meta["valid_m"]),
                                                 num_experts=self.shape.experts, **rng)
            flat = topk_ids.reshape(-1).long() - self.expert_start
            local = (flat >= 0) & (flat < self.local_experts)
            meta["row_index"] = torch.where(local, torch.arange(slots, device=dev), -1).to(
                torch.int32).reshape(num_tokens, top_k)
        else:
            offsets, inverse = contiguous_routing(topk_ids, **rng)
            meta.update(offsets=offsets, row_index=inverse,
                        scattered=torch.empty(slots, h, dtype=torch.bfloat16, device=dev))
        return meta

    def _gemm(self, name: str, inputs: torch.Tensor, outputs: torch.Tensor, meta: dict,
              **moe) -> None:
        w = self.weights[name]
        self.hm["humming_forward"](
            self.config[name], inputs=inputs, weight=w["weight"],
            weight_scale=w.get("weight_scale"), zero_point=None, bias=None,
            weight_scale_2=w.get("weight_scale_2"), outputs=outputs, locks=self.locks,
            valid_shape_m=meta["valid_m"], compute_config=self.compute,
            tuning_config=self.tuning[name][0], **moe)

    def __call__(self, hidden: torch.Tensor, topk_weights: torch.Tensor, meta: dict):
        process = self.hm["may_process_input"]
        activation = {"activation_type": "binary_split", "activation_impl": self.activation}
        if self.gemm_type == "indexed":
            s13, e13, n13 = meta["w13"]
            s2, e2, n2 = meta["w2"]
            top_k = topk_weights.shape[1]
            self._gemm("w13", hidden, meta["gate_up"], meta, sorted_ids=s13, expert_ids=e13,
                       num_tokens_padded=n13, top_k=top_k)
            process(self.config["w2"], inputs=meta["gate_up"], outputs=meta["act"],
                    token_scales=None, hadamard_block_size=self.hadamard["w2"], layout="normal",
                    **activation)
            self._gemm("w2", meta["act"], meta["down"], meta, sorted_ids=s2, expert_ids=e2,
                       num_tokens_padded=n2, top_k=1)
        else:
            valid = meta["offsets"][-1:]
            process(self.config["w13"], inputs=hidden, outputs=meta["scattered"],
                    token_scales=None, hadamard_block_size=self.hadamard["w13"],
                    layout="scatter", scatter_idx=meta["row_index"], num_valid_tokens=valid)
            self._gemm("w13", meta["scattered"], meta["gate_up"], meta,
                       expert_layout=meta["offsets"])
            process(self.config["w2"], inputs=meta["gate_up"], outputs=meta["act"],
                    token_scales=None, hadamard_block_size=self.hadamard["w2"], layout="normal",
                    num_valid_tokens=valid, **activation)
            self._gemm("w2", meta["act"], meta["down"], meta, expert_layout=meta["offsets"])
        return weighted_topk_sum(meta["down"], meta["row_index"], topk_weights, meta["out"])
