"""DeepSeek's own DeepSeek-V4 checkpoints (MXFP4 routed experts) through the real vLLM 0.33
(CPU): config parsing, our method selected, bit-exact loading, the exact conversion at load
time, the routed experts and the ffn against independent references, refusals, the switch.

The synthetic checkpoint is written in DeepSeek's release layout (``dsv4_ckpt``, family
``"mxfp4"``): ``config.json`` with ``quantization_config`` = block-FP8 128x128 ue8m0 and
``expert_dtype: "fp4"`` without ``moe_quant_algo``; per expert ``layers.L.ffn.experts.E.wN``
``.weight`` int8 ``[N, K/2]`` and ``.scale`` float8_e8m0fnu ``[N, K/32]``. vLLM reads it with
its own config parsing, safetensors iterator, mapper and loaders; only CUDA kernels are
replaced (``cpu_standins``).
"""

from __future__ import annotations

import json
import os
import traceback

import cpu_standins
import pytest
import torch
from dsv4_ckpt import EXPERTS, HIDDEN, LAYERS, MOE_INTER, Checkpoint, dequant_mxfp4

vllm = pytest.importorskip("vllm")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm.__version__ != cpu_standins.VLLM_VERSION,
                       reason=f"CPU stand-ins are pinned to vLLM {cpu_standins.VLLM_VERSION}"),
]

from test_glue_vllm import (  # noqa: E402  (after the version skip)
    TOKENS,
    _inputs,
    _layer,
    _rel,
    _routed,
    assert_routed_close,
    built_model,
    expert_parallel_rank_uses_only_its_experts,
    process,
    wperm_in_place_and_exact,
)


@pytest.fixture(scope="module")
def vllm_cpu():
    mp = pytest.MonkeyPatch()
    cpu_standins.install(mp)
    mp.setenv("NVFP4_OPS_VLLM", "1")
    mp.delenv("NVFP4_OPS_MXFP4", raising=False)
    from model_glue import plugin

    taken = plugin.register()
    assert taken, "glue did not install with NVFP4_OPS_VLLM=1"
    yield taken
    mp.undo()


@pytest.fixture(scope="module")
def engine(vllm_cpu, tmp_path_factory):
    ckpt = Checkpoint("mxfp4", seed=2024)
    directory = str(tmp_path_factory.mktemp("dsv4-mxfp4"))
    with built_model(ckpt, "native", directory) as eng:
        eng["dir"] = directory
        eng["before"] = {n: p.detach().clone() for n, p in eng["model"].named_parameters()
                         if ".ffn." in n}
        eng["ptrs"] = {n: p.data_ptr() for n, p in eng["model"].named_parameters()
                       if n.endswith(("w13_weight", "w2_weight"))}
        yield eng


@pytest.fixture(scope="module")
def processed(engine):
    process(engine)
    return engine


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def test_checkpoint_is_in_the_release_layout(engine):
    from safetensors import safe_open

    with open(os.path.join(engine["dir"], "config.json")) as f:
        cfg = json.load(f)
    assert cfg["expert_dtype"] == "fp4"
    q = cfg["quantization_config"]
    assert q["quant_method"] == "fp8" and "moe_quant_algo" not in q
    assert q["weight_block_size"] == [128, 128] and q["scale_fmt"] == "ue8m0"
    with safe_open(os.path.join(engine["dir"], "model.safetensors"), "pt") as f:
        w = f.get_tensor("layers.1.ffn.experts.3.w1.weight")
        s = f.get_tensor("layers.1.ffn.experts.3.w1.scale")
        down = f.get_tensor("layers.0.ffn.experts.0.w2.scale")
    assert w.dtype == torch.int8 and w.shape == (MOE_INTER, HIDDEN // 2)
    assert s.dtype == torch.float8_e8m0fnu and s.shape == (MOE_INTER, HIDDEN // 32)
    assert down.shape == (HIDDEN, MOE_INTER // 32)


def test_vllm_selects_our_mxfp4_method(engine, vllm_cpu):
    from model_glue.moe import Mxfp4OpsFusedMoE

    qc = engine["vc"].quant_config
    assert type(qc).__module__ == "model_glue.configs"
    assert qc.get_name() == "deepseek_v4_fp8"
    assert qc.expert_dtype == "fp4" and qc.moe_quant_algo == ""
    for layer in range(LAYERS):
        assert type(_routed(engine["model"], layer).quant_method) is Mxfp4OpsFusedMoE
        shared = _layer(engine["model"], layer).shared_experts
        assert type(shared.gate_up_proj.quant_method).__name__ == "Fp8LinearMethod"
    assert any("MXFP4" in line and "NVFP4_OPS_MXFP4=0" in line for line in vllm_cpu)


def test_parameters_are_vllms_mxfp4_ones_and_load_bit_exact(engine):
    """vLLM's Mxfp4MoEMethod parameters (names, dtypes, shapes), filled by vLLM's loader with
    the checkpoint's bytes: int8 codes and e8m0 scale bytes, bit for bit."""
    before, ckpt = engine["before"], engine["ckpt"]
    mismatches = []
    for layer, entry in enumerate(ckpt.layers):
        rx = f"model.layers.{layer}.ffn.experts.routed_experts"
        shapes = {n.removeprefix(rx + "."): (p.dtype, tuple(p.shape))
                  for n, p in before.items() if n.startswith(rx + ".w")}
        assert shapes == {
            "w13_weight": (torch.uint8, (EXPERTS, 2 * MOE_INTER, HIDDEN // 2)),
            "w13_weight_scale": (torch.uint8, (EXPERTS, 2 * MOE_INTER, HIDDEN // 32)),
            "w2_weight": (torch.uint8, (EXPERTS, HIDDEN, MOE_INTER // 2)),
            "w2_weight_scale": (torch.uint8, (EXPERTS, HIDDEN, MOE_INTER // 32)),
        }
        for e, ex in enumerate(entry["experts"]):
            want = {
                "w13_weight": torch.cat([_u8(ex["w1"].weight), _u8(ex["w3"].weight)]),
                "w13_weight_scale": torch.cat([_u8(ex["w1"].scale), _u8(ex["w3"].scale)]),
                "w2_weight": _u8(ex["w2"].weight),
                "w2_weight_scale": _u8(ex["w2"].scale),
            }
            for name, w in want.items():
                if not torch.equal(before[f"{rx}.{name}"][e], w):
                    mismatches.append(f"{rx}.{name}[{e}]")
    assert not mismatches, f"{len(mismatches)} tensors differ: {mismatches[:8]}"
    missing = {n for n, _ in engine["model"].named_parameters() if ".ffn." in n} \
        - set(engine["loaded"])
    assert not missing, sorted(missing)[:8]


def test_block_exponents_spread_over_20_binades_per_tensor(engine):
    """Each expert tensor's block exponents span >= 20 binades (so no single global scale per
    tensor, or per expert half, could hold it), each row <= 18 (one per row can)."""
    for ex in engine["ckpt"].layers[1]["experts"]:
        for proj in ex.values():
            e = _u8(proj.scale).int() - 127
            assert int(e.max() - e.min()) + 1 >= 20
            assert int((e.amax(1) - e.amin(1)).max()) + 1 <= 18


def test_conversion_is_exact_in_place_and_frees_the_e8m0_scales(processed):
    """After post-load processing: the codes are the loaded parameters themselves (same
    storage, same bytes), the e8m0 scales are gone, and the NVFP4 form (e4m3 per 16, one
    global per row) dequantizes bitwise to the independent MXFP4 dequantization."""
    from nvfp4_ops import format as fmt

    ckpt, before = processed["ckpt"], processed["before"]
    for layer in range(LAYERS):
        rx = _routed(processed["model"], layer)
        name = f"model.layers.{layer}.ffn.experts.routed_experts"
        for stem in ("w13", "w2"):
            codes = getattr(rx, f"{stem}_weight")
            assert codes.data_ptr() == processed["ptrs"][f"{name}.{stem}_weight"]
            assert torch.equal(codes, before[f"{name}.{stem}_weight"])
        assert rx.w13_weight_scale.dtype == torch.float8_e4m3fn
        assert rx.w13_weight_scale.shape == (EXPERTS, 2 * MOE_INTER, HIDDEN // 16)
        assert rx.w2_weight_scale.shape == (EXPERTS, HIDDEN, MOE_INTER // 16)
        assert rx.w13_weight_global.shape == (EXPERTS, 2 * MOE_INTER)
        assert rx.w2_weight_global.shape == (EXPERTS, HIDDEN)
        assert {n for n, _ in rx.named_parameters()} == {
            "e_score_correction_bias", "w13_weight", "w13_weight_scale", "w13_weight_global",
            "w2_weight", "w2_weight_scale", "w2_weight_global"} - (
            set() if layer else {"e_score_correction_bias"})
        assert rx.quant_method.wperm is False  # CPU keeps the checkpoint bit order
        for e, ex in enumerate(ckpt.layers[layer]["experts"]):
            got13 = fmt.dequantize(rx.w13_weight[e], rx.w13_weight_scale[e],
                                   rx.w13_weight_global[e])
            want13 = torch.cat([dequant_mxfp4(ex["w1"]), dequant_mxfp4(ex["w3"])])
            assert torch.equal(got13, want13), (layer, e, "w13")
            got2 = fmt.dequantize(rx.w2_weight[e], rx.w2_weight_scale[e],
                                  rx.w2_weight_global[e])
            assert torch.equal(got2, dequant_mxfp4(ex["w2"])), (layer, e, "w2")
        # per-row globals are needed: the rows of one expert half do not share a scale
        assert rx.w13_weight_global[:, :MOE_INTER].unique().numel() > 2


@pytest.mark.parametrize("layer", range(LAYERS))
def test_routed_experts_exact_vs_independent_reference(processed, layer):
    """vLLM's RoutedExperts.forward_modular -> our apply -> nvfp4::moe, given the reference's
    routing, against an fp32 reference computed from the MXFP4 checkpoint tensors alone that
    rounds where the numerics contract rounds (SwiGLU output, final output): within one bf16
    ulp but for rare fp32-order flips."""
    ckpt, model = processed["ckpt"], processed["model"]
    x, tok = _inputs(ckpt, layer, seed=600 + layer)
    ids, w, _ = ckpt.route(layer, x, tok)
    with torch.no_grad():
        out = _routed(model, layer).forward_modular(x, w.float(), ids.to(torch.int32))
    want = ckpt.routed_reference(layer, x, ids, w, bf16_activation=True)
    assert_routed_close(out, want)


@pytest.mark.parametrize("layer", range(LAYERS))
def test_ffn_forward_matches_independent_reference(processed, layer):
    """The whole ffn (vLLM's router, its block-FP8 shared expert, our routed experts)."""
    from vllm.forward_context import set_forward_context

    ckpt, model, vc = processed["ckpt"], processed["model"], processed["vc"]
    x, tok = _inputs(ckpt, layer, seed=700 + layer)
    ids, w, _ = ckpt.route(layer, x, tok)
    want = ckpt.routed_reference(layer, x, ids, w) + ckpt.shared_reference(layer, x)
    with set_forward_context(None, vc), torch.no_grad():
        got = _layer(model, layer)(x.clone(), tok)
    assert got.dtype == torch.bfloat16 and got.shape == (TOKENS, HIDDEN)
    assert torch.isfinite(got).all()
    assert _rel(got, want) < 1e-2


def test_expert_parallel_rank_uses_only_its_experts(processed):
    expert_parallel_rank_uses_only_its_experts(processed, seed=800)


def test_unrepresentable_tensor_is_refused_at_load(vllm_cpu, tmp_path):
    """A w2 row whose non-zero blocks span 19 binades cannot be held by one fp32 scale per
    row: post-load processing stops with an error naming the layer, that tensor (only), the
    row (local expert, row), the block and the switch that keeps vLLM's method."""
    import nvfp4_ops

    ckpt = Checkpoint("mxfp4", seed=31)
    w2 = ckpt.layers[1]["experts"][5]["w2"]
    scale = _u8(w2.scale).clone()
    codes = _u8(w2.weight).clone()
    scale[7, 0] = int(scale[7, 1:].max()) - 18  # block 0: 19 binades below the row's top
    codes[7, :16] = 0x11  # ... and not all zero
    w2.scale, w2.weight = scale.view(torch.float8_e8m0fnu), codes.view(torch.int8)
    with built_model(ckpt, "native", str(tmp_path)) as eng:
        with pytest.raises(nvfp4_ops.NVFP4InputError) as info:
            process(eng)
    msg = str(info.value)
    assert "model.layers.1.ffn" in msg and "w2_weight_scale" in msg, msg
    assert "w13_weight_scale" not in msg, f"names the other tensor too: {msg}"
    assert "row [5, 7]" in msg and "block 0" in msg and "span exponents" in msg, msg
    assert "NVFP4_OPS_MXFP4=0" in msg, f"says nothing of the way out: {msg}"


def test_missing_scale_tensor_is_refused_at_load(vllm_cpu, tmp_path):
    """A scale the checkpoint lacks keeps its 0xFF (NaN) start value and stops processing
    (instead of reading as 2^-127 and serving zeros)."""
    import nvfp4_ops

    ckpt = Checkpoint("mxfp4", seed=32)
    real = ckpt.tensors
    ckpt.tensors = lambda naming: {k: v for k, v in real(naming).items()
                                   if k != "layers.0.ffn.experts.3.w3.scale"}
    with built_model(ckpt, "native", str(tmp_path)) as eng:
        with pytest.raises(nvfp4_ops.NVFP4InputError,
                           match=r"layers\.0\.ffn.*w13_weight_scale.*scale\[3, 128, 0\] is "
                                 r"0xFF"):
            process(eng)


def test_switch_off_keeps_vllms_mxfp4_method(vllm_cpu, tmp_path, monkeypatch):
    """``NVFP4_OPS_MXFP4=0``: the routed experts get vLLM's own Mxfp4MoEMethod (which on a
    CPU-only machine finds no MXFP4 backend: that is where building stops), never ours; the
    switch takes the shared spellings and refuses others by name."""
    from model_glue.configs import mxfp4_enabled

    monkeypatch.setenv("NVFP4_OPS_MXFP4", "0")
    with pytest.raises(NotImplementedError, match="MXFP4 MoE backend") as info:
        with built_model(Checkpoint("mxfp4", seed=33), "native", str(tmp_path)):
            pass
    frames = [(os.path.basename(f.filename), f.name) for f in traceback.extract_tb(info.tb)]
    assert ("mxfp4.py", "__init__") in frames and ("configs.py", "get_quant_method") in frames
    assert all("model_glue/moe.py" not in f.filename for f in traceback.extract_tb(info.tb))
    for value, want in (("off", False), ("FALSE", False), (" no ", False), ("1", True),
                        ("On", True), ("yes", True), ("", True)):
        monkeypatch.setenv("NVFP4_OPS_MXFP4", value)
        assert mxfp4_enabled() is want, value
    monkeypatch.setenv("NVFP4_OPS_MXFP4", "maybe")
    with pytest.raises(ValueError, match="NVFP4_OPS_MXFP4 must be one of .* got 'maybe'"):
        mxfp4_enabled()


def test_wperm_after_conversion_in_place_and_exact(vllm_cpu, tmp_path, monkeypatch):
    """``NVFP4_OPS_MOE_WPERM=1`` (what CUDA does by default at V4 sizes): the scales are
    converted from the checkpoint-order codes, then the codes are permuted in place; the
    routed experts give bitwise the checkpoint-order answer, close to the MXFP4 reference."""
    monkeypatch.setenv("NVFP4_OPS_MOE_WPERM", "1")
    ckpt = Checkpoint("mxfp4", seed=34)
    got, x, ids, w = wperm_in_place_and_exact(ckpt, str(tmp_path), seed=900)
    ref = ckpt.routed_reference(1, x, ids, w, bf16_activation=True)
    assert _rel(got, ref.to(torch.bfloat16)) < 1e-3


def test_native_scales_load_exact_and_give_the_converted_answer(processed, tmp_path,
                                                                monkeypatch):
    """``NVFP4_OPS_MXFP4_SCALES=native``: the scales stay one UE8M0 byte per 32 k (the kernels'
    form, one global scale per expert half), dequantize bitwise to the checkpoint's
    MXFP4 weights, and the routed experts give bitwise the converted model's output."""
    from nvfp4_ops import format as fmt

    monkeypatch.setenv("NVFP4_OPS_MXFP4_SCALES", "native")
    ckpt = processed["ckpt"]
    with built_model(Checkpoint("mxfp4", seed=2024), "native", str(tmp_path)) as eng:
        process(eng)
        for layer in range(LAYERS):
            rx = _routed(eng["model"], layer)
            conv = _routed(processed["model"], layer)
            assert rx.w13_weight_scale.dtype == torch.float8_e8m0fnu
            assert rx.w13_weight_scale.shape == (EXPERTS, 2 * MOE_INTER, HIDDEN // 32)
            assert rx.w2_weight_scale.shape == (EXPERTS, HIDDEN, MOE_INTER // 32)
            # one global scale per expert half: the kernels' window holds each half
            assert rx.w13_weight_global.shape == (EXPERTS, 2)
            assert rx.w2_weight_global.shape == (EXPERTS,)
            assert rx.quant_method.describe(rx).mx
            for e, ex in enumerate(ckpt.layers[layer]["experts"]):
                rows13 = rx.w13_weight_global[e].repeat_interleave(MOE_INTER)
                got13 = fmt.dequantize(rx.w13_weight[e], rx.w13_weight_scale[e], rows13)
                want13 = torch.cat([dequant_mxfp4(ex["w1"]), dequant_mxfp4(ex["w3"])])
                assert torch.equal(got13, want13), (layer, e, "w13")
                got2 = fmt.dequantize(rx.w2_weight[e], rx.w2_weight_scale[e],
                                      rx.w2_weight_global[e])
                assert torch.equal(got2, dequant_mxfp4(ex["w2"])), (layer, e)
            x, tok = _inputs(ckpt, layer, seed=950 + layer)
            ids, w, _ = ckpt.route(layer, x, tok)
            with torch.no_grad():
                got = rx.forward_modular(x, w.float(), ids.to(torch.int32))
                want = conv.forward_modular(x, w.float(), ids.to(torch.int32))
            assert torch.equal(got, want), layer
