"""The glue inside the real vLLM 0.33 (CPU): config selection, weight loading, ffn forward.

For each quant family (``fp8`` + NVFP4 experts, ``modelopt`` NVFP4) and each naming style
(DeepSeek native, HF), one synthetic checkpoint is written to disk and run through vLLM's own
code: ``EngineArgs(...).create_engine_config()`` parses it and picks the quantization config,
vLLM builds ``DeepseekV4ForCausalLM`` (world size 1, gloo), reads the safetensors file with
its own iterator and loads it with the model's ``load_weights`` (its mapper,
``AutoWeightsLoader``, expert mapping and parameter loaders), then runs its
``process_weights_after_loading`` and each layer's ``ffn`` forward. Only CUDA-only kernels
are replaced (``cpu_standins``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket

import cpu_standins
import pytest
import torch
from dsv4_ckpt import (
    EXPERTS,
    HIDDEN,
    LAYERS,
    MOE_INTER,
    TOP_K,
    VOCAB,
    Checkpoint,
    transformers_hf_keys,
)

vllm = pytest.importorskip("vllm")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm.__version__ != cpu_standins.VLLM_VERSION,
                       reason=f"CPU stand-ins are pinned to vLLM {cpu_standins.VLLM_VERSION}"),
]

CASES = [("fp8", "native"), ("fp8", "hf"), ("modelopt", "native"), ("modelopt", "hf")]
TOKENS = 40


@pytest.fixture(scope="module")
def vllm_cpu():
    """Stand-ins, the glue (NVFP4_OPS_VLLM=1) and one world-size-1 gloo process group."""
    mp = pytest.MonkeyPatch()
    cpu_standins.install(mp)
    mp.setenv("NVFP4_OPS_VLLM", "1")
    from model_glue import plugin

    assert plugin.register(), "glue did not install with NVFP4_OPS_VLLM=1"
    yield
    mp.undo()


_dist_ready = False


def _init_dist_once():
    global _dist_ready
    if _dist_ready:
        return
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                 distributed_init_method=f"tcp://127.0.0.1:{port}",
                                 backend="gloo")
    initialize_model_parallel(1, 1)
    _dist_ready = True


@contextlib.contextmanager
def built_model(ckpt: Checkpoint, naming: str, directory: str, reverse: bool = False):
    """Write ``ckpt``, let vLLM parse it, build the model and load the file (vLLM's code)."""
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator
    from vllm.utils.torch_utils import set_default_torch_dtype

    tensors = ckpt.write(directory, naming)
    vc = EngineArgs(model=directory, skip_tokenizer_init=True, enforce_eager=True,
                    max_model_len=256, dtype="bfloat16",
                    compilation_config={"custom_ops": ["none"]}).create_engine_config()
    with set_current_vllm_config(vc):
        _init_dist_once()
        with set_default_torch_dtype(torch.bfloat16), torch.device("cpu"):
            model = initialize_model(vllm_config=vc)
        files = [os.path.join(directory, "model.safetensors")]
        weights = safetensors_weights_iterator(files, False)
        if reverse:  # e.g. the up shard of a fused projection before the gate shard
            weights = reversed(list(weights))
        loaded = model.load_weights(weights)
        yield dict(family=ckpt.family, naming=naming, ckpt=ckpt, tensors=tensors, vc=vc,
                   model=model, loaded=loaded)


def process(engine) -> None:
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    process_weights_after_loading(engine["model"], engine["vc"].model_config,
                                  torch.device("cpu"))


@pytest.fixture(scope="module", params=CASES, ids=["-".join(c) for c in CASES])
def engine(request, vllm_cpu, tmp_path_factory):
    family, naming = request.param
    # The HF-named ModelOpt export is the weight-only variant (quant_algo W4A16_NVFP4).
    algo = "W4A16_NVFP4" if request.param == ("modelopt", "hf") else "NVFP4"
    ckpt = Checkpoint(family, seed=1000 + CASES.index(request.param), quant_algo=algo)
    directory = str(tmp_path_factory.mktemp(f"dsv4-{family}-{naming}"))
    with built_model(ckpt, naming, directory) as eng:
        eng["before"] = {n: p.detach().clone() for n, p in eng["model"].named_parameters()
                         if ".ffn." in n}
        yield eng


def _layer(model, layer):
    return model.model.layers[layer].ffn


def _routed(model, layer):
    return _layer(model, layer).experts.routed_experts


def test_vllm_selects_our_methods(engine):
    from model_glue.linear import Nvfp4OpsLinearMethod
    from model_glue.moe import ModelOptNvFp4OpsFusedMoE

    qc = type(engine["vc"].quant_config)
    assert qc.__module__ == "model_glue.configs"
    assert engine["vc"].quant_config.get_name() == {"fp8": "deepseek_v4_fp8",
                                                    "modelopt": "modelopt_fp4"}[engine["family"]]
    if engine["family"] == "modelopt":
        assert engine["vc"].quant_config.quant_method == engine["ckpt"].quant_algo
    for layer in range(LAYERS):
        assert type(_routed(engine["model"], layer).quant_method) is ModelOptNvFp4OpsFusedMoE
        shared = _layer(engine["model"], layer).shared_experts
        shared_methods = {type(shared.gate_up_proj.quant_method).__name__,
                          type(shared.down_proj.quant_method).__name__}
        if engine["family"] == "modelopt":
            assert shared_methods == {Nvfp4OpsLinearMethod.__name__}
        else:  # the official exports keep shared experts block-FP8: vLLM's method
            assert shared_methods == {"Fp8LinearMethod"}
    # the attention is vLLM's in both families (block-FP8 / excluded)
    attn_method = type(engine["model"].model.layers[0].attn.fused_wqa_wkv.quant_method).__name__
    assert attn_method in ("Fp8LinearMethod", "UnquantizedLinearMethod")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32) \
        if t.element_size() == 4 else t.view(torch.int16)


def test_weights_load_bit_exact(engine):
    """Every checkpoint tensor of the ffn lands, bit for bit, where vLLM's method expects it."""
    ckpt, before = engine["ckpt"], engine["before"]
    mismatches = []

    def same(name, got, want):
        if got.shape != want.shape or not torch.equal(_bits(got.contiguous()),
                                                      _bits(want.contiguous())):
            mismatches.append(name)

    for layer, entry in enumerate(ckpt.layers):
        pre = f"model.layers.{layer}.ffn"
        same(f"{pre}.gate.weight", before[f"{pre}.gate.weight"], entry["gate"])
        if "tid2eid" in entry:
            same(f"{pre}.gate.tid2eid", before[f"{pre}.gate.tid2eid"], entry["tid2eid"])
        else:
            same(f"{pre}.gate.e_score_correction_bias",
                 before[f"{pre}.gate.e_score_correction_bias"], entry["bias"])
        rx = f"{pre}.experts.routed_experts"
        for e, ex in enumerate(entry["experts"]):
            same(f"{rx}.w13_weight[{e}]", before[f"{rx}.w13_weight"][e],
                 torch.cat([ex["w1"].weight, ex["w3"].weight]))
            same(f"{rx}.w13_weight_scale[{e}]", before[f"{rx}.w13_weight_scale"][e],
                 torch.cat([ex["w1"].weight_scale, ex["w3"].weight_scale]))
            same(f"{rx}.w13_weight_scale_2[{e}]", before[f"{rx}.w13_weight_scale_2"][e],
                 torch.stack([ex["w1"].weight_scale_2, ex["w3"].weight_scale_2]))
            same(f"{rx}.w2_weight[{e}]", before[f"{rx}.w2_weight"][e], ex["w2"].weight)
            same(f"{rx}.w2_weight_scale[{e}]", before[f"{rx}.w2_weight_scale"][e],
                 ex["w2"].weight_scale)
            same(f"{rx}.w2_weight_scale_2[{e}]", before[f"{rx}.w2_weight_scale_2"][e],
                 ex["w2"].weight_scale_2)
        sh = f"{pre}.shared_experts"
        s = entry["shared"]
        if engine["family"] == "fp8":
            same(f"{sh}.gate_up_proj.weight", before[f"{sh}.gate_up_proj.weight"],
                 torch.cat([s["w1"][0], s["w3"][0]]))
            same(f"{sh}.down_proj.weight", before[f"{sh}.down_proj.weight"], s["w2"][0])
        else:
            same(f"{sh}.gate_up_proj.weight", before[f"{sh}.gate_up_proj.weight"],
                 torch.cat([s["w1"].weight, s["w3"].weight]))
            same(f"{sh}.gate_up_proj.weight_scale_2",
                 before[f"{sh}.gate_up_proj.weight_scale_2"],
                 torch.stack([s["w1"].weight_scale_2, s["w3"].weight_scale_2]))
            same(f"{sh}.down_proj.weight_scale", before[f"{sh}.down_proj.weight_scale"],
                 s["w2"].weight_scale)
    assert not mismatches, f"{len(mismatches)} tensors differ: {mismatches[:8]}"


def test_every_checkpoint_key_is_loaded(engine):
    """vLLM reports every ffn parameter loaded, and none stays at its NaN sentinel."""
    ffn_params = {n for n, _ in engine["model"].named_parameters() if ".ffn." in n}
    missing = ffn_params - set(engine["loaded"])
    assert not missing, sorted(missing)[:8]
    for n, p in engine["before"].items():
        if p.is_floating_point():
            assert not torch.isnan(p.float()).any(), f"{n} never loaded (NaN sentinel)"


def _resolve_param(model, vllm_name: str, params: set[str]) -> str | None:
    """The parameter a (mapped) checkpoint name loads into: itself, its fused projection
    (the model's packed_modules_mapping), or the routed-experts tensor of its expert."""
    if vllm_name in params:
        return vllm_name
    for fused, parts in model.packed_modules_mapping.items():
        for part in parts:
            cand = vllm_name.replace(f".{part}.", f".{fused}.", 1)
            if cand != vllm_name and cand in params:
                return cand
    m = re.search(r"^(.*\.experts)\.\d+\.(w[123])\.(\w+)$", vllm_name)
    if m:
        stem = "w2_" if m.group(2) == "w2" else "w13_"
        cand = f"{m.group(1)}.routed_experts.{stem}{m.group(3)}"
        return cand if cand in params else None
    return None


def test_every_hf_name_lands_in_one_vllm_parameter(engine):
    """Each key transformers' DeepSeek-V4 has (experts per ModelOpt's HF export) maps, through
    the model's mapper, onto a parameter or buffer of vLLM's model, and the mapped names
    cover every parameter vLLM's model has."""
    if engine["naming"] != "hf":
        pytest.skip("name coverage is a property of the mapper; checked once per family")
    model = engine["model"]
    params = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    landed, lost = {}, []
    for key in transformers_hf_keys():
        mapped = model.hf_to_vllm_mapper.map_name(key)
        target = None if mapped is None else _resolve_param(model, mapped, params)
        if target is None:
            lost.append((key, mapped))
        landed.setdefault(target, []).append(key)
    assert not lost, f"{len(lost)} keys land nowhere: {lost[:6]}"
    real_params = {n for n, _ in model.named_parameters()}
    scale_like = ("_scale", "_scale_inv", "_scale_2")
    uncovered = [p for p in real_params - set(landed) if not p.endswith(scale_like)]
    assert not uncovered, uncovered[:8]


@pytest.fixture(scope="module")
def processed(engine):
    process(engine)
    return engine


def test_after_processing_both_w13_scales_kept_and_input_scales_freed(processed):
    ckpt = processed["ckpt"]
    for layer in range(LAYERS):
        rx = _routed(processed["model"], layer)
        want = torch.stack([torch.stack([ex["w1"].weight_scale_2, ex["w3"].weight_scale_2])
                            for ex in ckpt.layers[layer]["experts"]])
        assert torch.equal(rx.w13_weight_scale_2, want)
        ratio = rx.w13_weight_scale_2[:, 1] / rx.w13_weight_scale_2[:, 0]
        assert torch.equal(ratio, torch.full_like(ratio, 4.0))
        assert not hasattr(rx, "w13_input_scale") and not hasattr(rx, "w2_input_scale")
        # no repacked copy: the weights the op reads are the loaded parameters themselves
        assert rx.w13_weight.shape == (EXPERTS, 2 * MOE_INTER, HIDDEN // 2)
        # on CPU the default (NVFP4_OPS_MOE_WPERM=auto) keeps the checkpoint bit order
        assert rx.quant_method.wperm is False
        if processed["family"] == "modelopt":
            gu = _layer(processed["model"], layer).shared_experts.gate_up_proj
            s = ckpt.layers[layer]["shared"]
            want_rows = torch.cat([s["w1"].weight_scale_2.expand(MOE_INTER),
                                   s["w3"].weight_scale_2.expand(MOE_INTER)])
            assert torch.equal(gu.weight_global, want_rows)
            assert not hasattr(gu, "weight_scale_2") and not hasattr(gu, "input_scale")


def _inputs(ckpt, layer, seed):
    """bf16 hidden states whose biased top-k has a clear margin (no near-ties to flip)."""
    gen = torch.Generator().manual_seed(seed)
    xs, ids = [], []
    while sum(len(x) for x in xs) < TOKENS:
        x = torch.randn(64, HIDDEN, generator=gen).to(torch.bfloat16)
        tok = torch.randint(0, VOCAB, (64,), generator=gen)
        _, _, margin = ckpt.route(layer, x, tok)
        keep = margin > 0.02
        xs.append(x[keep])
        ids.append(tok[keep])
    return torch.cat(xs)[:TOKENS], torch.cat(ids)[:TOKENS]


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("layer", range(LAYERS))
def test_ffn_forward_matches_independent_reference(processed, layer):
    """The layer's full ffn (vLLM router + shared experts + our routed experts) against an
    fp32 reference computed from the checkpoint tensors alone."""
    from vllm.forward_context import set_forward_context

    ckpt, model, vc = processed["ckpt"], processed["model"], processed["vc"]
    x, tok = _inputs(ckpt, layer, seed=100 + layer)
    ids, w, _ = ckpt.route(layer, x, tok)
    want = ckpt.routed_reference(layer, x, ids, w) + ckpt.shared_reference(layer, x)
    stock = ckpt.routed_reference(layer, x, ids, w, gate_scale_for_up=True) \
        + ckpt.shared_reference(layer, x)
    with set_forward_context(None, vc), torch.no_grad():
        got = _layer(model, layer)(x.clone(), tok)
    assert got.dtype == torch.bfloat16 and got.shape == (TOKENS, HIDDEN)
    assert torch.isfinite(got).all()
    err = _rel(got, want)
    # bf16 activations between the projections (vLLM's shared MLP, our SwiGLU output) bound
    # this; the gate-scale-for-both-halves answer is far outside it.
    assert err < 1e-2, err
    assert _rel(stock, want) > 20 * 1.5e-2


def _bf16_ulp(t: torch.Tensor) -> torch.Tensor:
    exp = torch.floor(torch.log2(t.abs().clamp(min=2.0**-100)))
    return torch.exp2(exp - 7)


@pytest.mark.parametrize("layer", range(LAYERS))
def test_routed_experts_exact_vs_reference(processed, layer):
    """vLLM's RoutedExperts.forward_modular -> our apply -> nvfp4::moe, given the reference's
    routing: within one bf16 ulp of the fp32 reference that rounds where the numerics contract
    rounds (SwiGLU output and final output, once each) -- i.e. exact up to fp32 summation
    order. Both w13 global scales are applied (the up scale is 4x the gate's here)."""
    ckpt, model = processed["ckpt"], processed["model"]
    x, tok = _inputs(ckpt, layer, seed=200 + layer)
    ids, w, _ = ckpt.route(layer, x, tok)
    out = torch.full((TOKENS, HIDDEN), float("nan"), dtype=torch.bfloat16)
    with torch.no_grad():
        out.copy_(_routed(model, layer).forward_modular(x, w.float(), ids.to(torch.int32)))
    want = ckpt.routed_reference(layer, x, ids, w, bf16_activation=True)
    assert_routed_close(out, want)


def assert_routed_close(out: torch.Tensor, want: torch.Tensor) -> None:
    """The routed experts' bf16 output against the fp32 reference of the same routing: within
    one bf16 ulp but for rare fp32-order flips, and 1e-3 relative L2 of the reference rounded
    to bf16 once."""
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    diff = (out.float() - want).abs()
    # fp32 order can flip the bf16 rounding of an intermediate SwiGLU value; such a flip
    # moves an output by ~|w2| * ulp(h), far below 0.4% of the output range.
    over = diff > _bf16_ulp(want) + 4e-3 * want.abs().max()
    beyond_ulp = int((diff > _bf16_ulp(want)).sum())
    assert not over.any() and beyond_ulp <= diff.numel() // 1000, (
        f"{int(over.sum())} outputs beyond tolerance, {beyond_ulp} of {diff.numel()} beyond "
        f"1 bf16 ulp; max abs diff {diff.max():.3e}, rel L2 {_rel(out, want):.2e}")
    rel = _rel(out, want.to(torch.bfloat16))
    assert rel < 1e-3, rel  # vs the reference rounded to bf16 once


@pytest.mark.parametrize("bad", ["zero", "nan", "missing"])
def test_bad_global_scale_fails_loudly(vllm_cpu, tmp_path, bad):
    """A zero / non-finite / absent ``weight_scale_2`` stops post-load processing with an
    error naming the layer and the tensor, instead of serving garbage."""
    import nvfp4_ops

    ckpt = Checkpoint("fp8", seed=7)
    up = ckpt.layers[1]["experts"][5]["w3"]
    if bad == "zero":
        up.weight_scale_2 = torch.tensor(0.0)
    elif bad == "nan":
        up.weight_scale_2 = torch.tensor(float("nan"))
    naming = "native"
    if bad == "missing":
        real_tensors = ckpt.tensors
        ckpt.tensors = lambda naming: {k: v for k, v in real_tensors(naming).items()
                                       if k != "layers.1.ffn.experts.5.w3.weight_scale_2"}
    with built_model(ckpt, naming, str(tmp_path)) as eng:
        with pytest.raises(nvfp4_ops.NVFP4InputError,
                           match=r"layers\.1\.ffn.*w13_weight_scale_2.*w13_global must be"):
            process(eng)


def expert_parallel_rank_uses_only_its_experts(engine, seed: int) -> None:
    """EP on layer 1 of a processed model: a rank holding experts [4, 8) of 8 (vLLM's linear
    placement -> ``expert_start``) or a round-robin set (-> id remap) gets global ids and adds
    only its own experts' contributions."""
    from types import SimpleNamespace

    full = _routed(engine["model"], 1)
    method = full.quant_method
    x, tok = _inputs(engine["ckpt"], 1, seed=seed)
    ids, w, _ = engine["ckpt"].route(1, x, tok)
    ids = ids.to(torch.int32)
    # the codes and every scale parameter of the layer, sliced to the rank's experts
    names = ("w13_weight", "w2_weight",
             *(n for n, _ in full.named_parameters(recurse=False) if "_weight_" in n))
    for local in ([4, 5, 6, 7], [1, 3, 5, 7]):
        emap = torch.full((EXPERTS,), -1, dtype=torch.int32)
        emap[local] = torch.arange(len(local), dtype=torch.int32)
        sel = torch.tensor(local)
        shard = SimpleNamespace(expert_map=emap, global_num_experts=EXPERTS,
                                swiglu_limit=full.swiglu_limit,
                                **{n: getattr(full, n)[sel] for n in names})
        method._setup_expert_range(shard)
        try:
            assert (method.global_to_local is None) == (local == [4, 5, 6, 7])
            assert method.expert_start == (4 if local == [4, 5, 6, 7] else 0)
            got = method.apply(shard, x, w.float(), ids, None, None)
        finally:
            method._setup_expert_range(full)
        mine = torch.isin(ids, sel)
        want = method.apply(full, x, torch.where(mine, w, 0.0).float(), ids, None, None)
        assert torch.equal(got, want), local
        assert not torch.equal(got, method.apply(full, x, w.float(), ids, None, None))


def test_expert_parallel_rank_uses_only_its_experts(processed):
    expert_parallel_rank_uses_only_its_experts(processed, seed=300)


def wperm_in_place_and_exact(ckpt: Checkpoint, directory: str, seed: int):
    """With ``NVFP4_OPS_MOE_WPERM=1`` set: build and process ``ckpt``; post-load processing
    permutes layer 1's expert codes in place (same storage, no copy) into the ``wperm`` bit
    order, and the routed experts then give bitwise the checkpoint-order answer (the CPU
    reference undoes the order exactly). Returns ``(got, x, ids, weights)`` of that call."""
    from types import SimpleNamespace

    from nvfp4_ops.orders.wperm import to_wperm

    with built_model(ckpt, "native", directory) as eng:
        rx = _routed(eng["model"], 1)
        before = {n: getattr(rx, n).detach().clone() for n in ("w13_weight", "w2_weight")}
        ptrs = {n: getattr(rx, n).data_ptr() for n in before}
        process(eng)
        method = rx.quant_method
        assert method.wperm is True
        for n, b in before.items():
            assert getattr(rx, n).data_ptr() == ptrs[n]
            assert torch.equal(getattr(rx, n), to_wperm(b))
        x, tok = _inputs(ckpt, 1, seed=seed)
        ids, w, _ = ckpt.route(1, x, tok)
        ids = ids.to(torch.int32)
        # the same layer with the checkpoint-order codes: every scale parameter it holds
        scales = {n: p for n, p in rx.named_parameters(recurse=False) if "_weight_" in n}
        with torch.no_grad():
            got = method.apply(rx, x, w.float(), ids, None, None)
            plain = SimpleNamespace(
                global_num_experts=rx.global_num_experts, swiglu_limit=rx.swiglu_limit,
                w13_weight=before["w13_weight"], w2_weight=before["w2_weight"], **scales)
            method.wperm = False
            try:
                want = method.apply(plain, x, w.float(), ids, None, None)
            finally:
                method.wperm = True
        assert torch.isfinite(want).all() and torch.equal(got, want)
    return got, x, ids, w


def test_wperm_prepared_in_place_and_exact(vllm_cpu, tmp_path, monkeypatch):
    monkeypatch.setenv("NVFP4_OPS_MOE_WPERM", "1")
    wperm_in_place_and_exact(Checkpoint("modelopt", seed=13), str(tmp_path), seed=500)


def test_fused_shards_load_in_any_order(vllm_cpu, tmp_path):
    """A fused projection's per-shard global scales are buffered until all shards are in, so
    the per-row scale is right whichever shard arrives first (ModelOpt shared experts: gate
    and up global scales 4x apart)."""
    from vllm.forward_context import set_forward_context

    ckpt = Checkpoint("modelopt", seed=11)
    with built_model(ckpt, "native", str(tmp_path), reverse=True) as eng:
        process(eng)
        gu = _layer(eng["model"], 1).shared_experts.gate_up_proj
        s = ckpt.layers[1]["shared"]
        assert torch.equal(gu.weight_global, torch.cat([
            s["w1"].weight_scale_2.expand(MOE_INTER), s["w3"].weight_scale_2.expand(MOE_INTER)]))
        x, tok = _inputs(ckpt, 1, seed=400)
        ids, w, _ = ckpt.route(1, x, tok)
        want = ckpt.routed_reference(1, x, ids, w) + ckpt.shared_reference(1, x)
        with set_forward_context(None, eng["vc"]), torch.no_grad():
            got = _layer(eng["model"], 1)(x.clone(), tok)
        assert _rel(got, want) < 1.5e-2


def test_nvfp4_attention_output_projection_is_refused(engine):
    """wo_a/wo_b bypass linear methods in vLLM's DeepSeek-V4 attention: a clear error at
    build time instead of wrong results later."""
    import copy

    from vllm.model_executor.layers.linear import ReplicatedLinear

    if engine["family"] != "modelopt" or engine["naming"] != "native":
        pytest.skip("one ModelOpt config is enough")
    qc = copy.copy(engine["vc"].quant_config)
    qc.exclude_modules = []
    with pytest.raises(NotImplementedError, match="wo_a"):
        ReplicatedLinear(256, 256, bias=False, quant_config=qc,
                         prefix="model.layers.0.attn.wo_a")
    layer = ReplicatedLinear(256, 256, bias=False, quant_config=qc,
                             prefix="model.layers.0.attn.wq_b")
    assert type(layer.quant_method).__name__ == "Nvfp4OpsLinearMethod"


def test_dense_wfrag_prepared_in_place_and_exact(vllm_cpu, tmp_path, monkeypatch):
    """``NVFP4_OPS_DENSE_WFRAG=1``: post-load processing permutes a quantized
    linear's codes in place (same storage) into the prepared order of ``nvfp4::to_wfrag_``;
    the layer then gives bitwise the checkpoint-order answer (the CPU reference undoes it)."""
    from nvfp4_ops.orders.wfrag import unprepared

    monkeypatch.setenv("NVFP4_OPS_DENSE_WFRAG", "1")
    ckpt = Checkpoint("modelopt", seed=17)
    with built_model(ckpt, "native", str(tmp_path)) as eng:
        gu = _layer(eng["model"], 1).shared_experts.gate_up_proj
        before = gu.weight.detach().clone()
        ptr = gu.weight.data_ptr()
        process(eng)
        assert gu.nvfp4_wfrag is True and gu.weight.data_ptr() == ptr
        assert not torch.equal(gu.weight, before)
        assert torch.equal(unprepared(gu.weight), before)
        x = torch.randn(5, gu.input_size_per_partition, generator=torch.Generator().manual_seed(3))
        x = x.to(torch.bfloat16)
        with torch.no_grad():
            got = gu.quant_method.apply(gu, x)
        want = torch.ops.nvfp4.linear(x, before, gu.weight_scale, gu.weight_global, None)
        assert torch.isfinite(want).all() and torch.equal(got, want)
    from nvfp4_ops import _env
    from nvfp4_ops.prepare import prepare_linear

    # the switch the glue reads (model_glue.linear): a bad value is refused by name
    monkeypatch.setenv("NVFP4_OPS_DENSE_WFRAG", "sometimes")
    with pytest.raises(ValueError, match="NVFP4_OPS_DENSE_WFRAG"):
        _env.auto_flag(_env.DENSE_WFRAG)
    # auto: CPU weights keep the checkpoint order
    assert prepare_linear(before.clone(), gu.weight_scale, gu.weight_global)[1] is False


def test_every_prepared_layer_is_warmed_from_its_own_sizes(vllm_cpu, tmp_path, monkeypatch):
    """Post-load processing ends with a warm-up of the layer's kernels, described from the
    loaded parameters (model_glue.warm): the routed experts and, for ModelOpt, the quantized
    shared-expert linears. On CPU weights the warm-up itself does nothing."""
    import model_glue.linear
    import model_glue.moe
    import nvfp4_ops

    seen = []

    def record(layer, device):
        seen.append((layer, device.type))
        return False

    monkeypatch.setattr(model_glue.moe, "warm_layer", record)
    monkeypatch.setattr(model_glue.linear, "warm_layer", record)
    with built_model(Checkpoint("modelopt", seed=23), "native", str(tmp_path)) as eng:
        process(eng)
    moe = nvfp4_ops.MoELayer(experts=EXPERTS, hidden=HIDDEN, inter=MOE_INTER, top_k=TOP_K)
    assert [d for d in seen if isinstance(d[0], nvfp4_ops.MoELayer)] == [(moe, "cpu")] * LAYERS
    linears = {d[0] for d in seen if isinstance(d[0], nvfp4_ops.LinearLayer)}
    assert nvfp4_ops.LinearLayer(2 * MOE_INTER, HIDDEN) in linears  # shared gate_up_proj
    assert nvfp4_ops.LinearLayer(HIDDEN, MOE_INTER) in linears  # shared down_proj
    assert all(dev == "cpu" for _, dev in seen)


def test_warm_layer_warms_cuda_weights_only(vllm_cpu, monkeypatch):
    """The glue warms on CUDA only, and not with the reference backend; a layer whose
    variants all ran before (``nvfp4_ops.warmup`` returns none) reports nothing new."""
    import model_glue.warm as warm
    import nvfp4_ops

    calls = []
    results = iter([["k1", "k2"], []])
    monkeypatch.setattr(nvfp4_ops, "warmup",
                        lambda layers, run: calls.append((layers, run)) or next(results))
    a = nvfp4_ops.LinearLayer(256, 512, wfrag=True)
    assert warm.warm_layer(a, torch.device("cpu")) is False and calls == []
    assert warm.warm_layer(a, torch.device("cuda", 0)) is True
    assert warm.warm_layer(a, torch.device("cuda", 0)) is False
    assert calls == [([a], True), ([a], True)]
    monkeypatch.setenv("NVFP4_OPS_BACKEND", "reference")
    assert warm.warm_layer(a, torch.device("cuda", 0)) is False and len(calls) == 2
