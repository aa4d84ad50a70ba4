"""HF-format DeepSeek-V4 names -> native names, checked against transformers' own renames.

transformers 5 ships the native -> HF renames it applies when it loads an original DeepSeek-V4
checkpoint (``conversion_mapping``, ``deepseek_v4``). Those rules are independent of ours, so:
for every key of transformers' ``DeepseekV4ForCausalLM`` state dict, our HF -> native name,
renamed back by transformers' rules, must give the key again; and inside vLLM's mapper the
HF key must end exactly where its native name does.
"""

from __future__ import annotations

import pytest
from dsv4_ckpt import transformers_hf_keys

from model_glue.names import hf_to_native, with_hf_names

transformers = pytest.importorskip("transformers")
vllm = pytest.importorskip("vllm")
# vLLM's DeepSeek-V4 mapper internals (``_make_deepseek_v4_weights_mapper``) are 0.33's.
pytestmark = pytest.mark.skipif(vllm.__version__ != "0.33.0", reason="pinned to vLLM 0.33.0")

@pytest.fixture(scope="module")
def hf_keys() -> list[str]:
    return transformers_hf_keys()


def _transformers_native_to_hf(native: str) -> str:
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightRenaming

    key = native
    for rule in get_checkpoint_conversion_mapping("deepseek_v4"):
        if isinstance(rule, WeightRenaming):
            key, _ = rule.rename_source_key(key)
    return key if key.startswith("lm_head.") else f"model.{key}"


def _per_expert_native_to_hf(native: str) -> str:
    """Per-expert names are not in transformers' renames (it fuses experts); ModelOpt's
    HF export names them ``mlp.experts.E.{gate,up,down}_proj``."""
    proj = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    parts = native.split(".")  # layers.L.ffn.experts.E.wN.suffix
    return f"model.layers.{parts[1]}.mlp.experts.{parts[4]}.{proj[parts[5]]}.{parts[6]}"


def test_round_trip_through_transformers_renames(hf_keys):
    bad = []
    for key in hf_keys:
        native = hf_to_native(key)
        back = (_per_expert_native_to_hf(native) if ".ffn.experts." in native
                else _transformers_native_to_hf(native))
        if back != key:
            bad.append((key, native, back))
    assert not bad, f"{len(bad)} of {len(hf_keys)} keys do not round-trip: {bad[:5]}"


def test_native_names_pass_unchanged(hf_keys):
    natives = [hf_to_native(k) for k in hf_keys]
    assert all(not n.startswith("model.") for n in natives)
    assert [hf_to_native(n) for n in natives] == natives


def test_native_names_are_distinct(hf_keys):
    natives = [hf_to_native(k) for k in hf_keys]
    assert len(set(natives)) == len(natives)


def test_inside_vllm_mapper_hf_lands_where_native_does(hf_keys):
    from vllm.models.deepseek_v4 import DeepseekV4ForCausalLM

    for expert_dtype in ("fp4", "fp8"):
        vllm_mapper = DeepseekV4ForCausalLM.hf_to_vllm_mapper
        if expert_dtype == "fp8":
            from vllm.models.deepseek_v4.nvidia.model import _make_deepseek_v4_weights_mapper

            vllm_mapper = _make_deepseek_v4_weights_mapper("fp8")
        ours = with_hf_names(vllm_mapper)
        bad = [(k, ours.map_name(k), vllm_mapper.map_name(hf_to_native(k))) for k in hf_keys
               if ours.map_name(k) != vllm_mapper.map_name(hf_to_native(k))]
        assert not bad, bad[:5]
        # and native checkpoints map exactly as with vLLM's own mapper
        natives = [hf_to_native(k) for k in hf_keys]
        assert [ours.map_name(n) for n in natives] == [vllm_mapper.map_name(n) for n in natives]


def test_specific_before_general():
    # gate_proj is the compressor's wgate but an MLP's w1
    assert hf_to_native("model.layers.3.self_attn.compressor.gate_proj.weight") == \
        "layers.3.attn.compressor.wgate.weight"
    assert hf_to_native("model.layers.3.mlp.shared_experts.gate_proj.weight_scale") == \
        "layers.3.ffn.shared_experts.w1.weight_scale"
    assert hf_to_native("model.layers.3.mlp.experts.17.up_proj.weight_scale_2") == \
        "layers.3.ffn.experts.17.w3.weight_scale_2"
    # the indexer's compressor: HF nests it under the compressor, native the other way round
    assert hf_to_native("model.layers.3.self_attn.compressor.indexer.kv_proj.weight") == \
        "layers.3.attn.indexer.compressor.wkv.weight"
    # whole-model leaves go all the way to native: no double mapping by vLLM's suffix rules
    from vllm.models.deepseek_v4 import DeepseekV4ForCausalLM

    mapper = with_hf_names(DeepseekV4ForCausalLM.hf_to_vllm_mapper)
    assert mapper.map_name("lm_head.weight") == "lm_head.weight"
    assert mapper.map_name("model.embed_tokens.weight") == "model.embed_tokens.weight"


def test_modelopt_exclude_patterns_map_like_vllm_expects():
    from vllm.models.deepseek_v4 import DeepseekV4ForCausalLM

    mapper = with_hf_names(DeepseekV4ForCausalLM.hf_to_vllm_mapper).get_rename_mapper()
    got = mapper.apply_list(["model.layers.*.self_attn", "model.layers.*.self_attn.*",
                             "model.layers.*.mlp.shared_experts.*", "lm_head",
                             "layers.*.attn.*"])
    assert got == ["model.layers.*.attn", "model.layers.*.attn.*",
                   "model.layers.*.ffn.shared_experts.*", "lm_head", "model.layers.*.attn.*"]
