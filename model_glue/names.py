"""Checkpoint names: HuggingFace-format DeepSeek-V4 exports -> DeepSeek's native names.

vLLM 0.33's DeepSeek-V4 loader understands the native names (``layers.L.attn.wq_a``,
``layers.L.ffn.experts.E.w1``, ``embed.weight``, ``head.weight``, ...) through its
``hf_to_vllm_mapper``. ModelOpt exports of the HuggingFace-format model use transformers'
names instead (``model.layers.L.self_attn.q_a_proj``, ``model.layers.L.mlp.experts.E.gate_proj``,
``model.embed_tokens.weight``, ``lm_head.weight``, ...), which that mapper leaves untouched, so
they land in no parameter.

:data:`HF_TO_NATIVE` rewrites an HF-format name into the native one; :func:`with_hf_names`
puts these rules *in front of* vLLM's own mapper, so every name goes HF -> native -> vLLM and
vLLM's rules run unchanged on native names. A native checkpoint never matches the HF rules:
native names never start with ``model.`` or ``lm_head.``, and every rule is anchored there.

Order matters (specific before general):

1. the whole-model leaves (``lm_head``, ``embed_tokens``, ``hc_head.*``, final ``norm``) are
   renamed to ``head.weight``, ``embed.weight``, ``hc_head_*``, ``norm.weight`` — going all
   the way to native avoids vLLM's ``head.weight`` / ``embed.weight`` suffix rules mapping an
   already-HF name a second time (``lm_head.weight`` -> ``lm_lm_head.weight``);
2. the indexer inside the compressor (HF nests it as ``self_attn.compressor.indexer``; native
   has ``attn.indexer`` with its own ``compressor``) before the plain compressor renames;
3. per-projection renames, each scoped to its module (``gate_proj`` means ``wgate`` in a
   compressor but ``w1`` in an MLP);
4. last the general module renames ``self_attn`` -> ``attn`` and ``mlp`` -> ``ffn``, and the
   ``model.`` prefix.
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["HF_TO_NATIVE", "hf_to_native", "with_hf_names"]

_L = r"^model\.layers\.(\d+|\*)\."  # HF layer prefix; group 1: layer index (or "*" in lists)
_MLP_PROJ = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
_COMPRESSOR_LEAF = (
    (r"kv_proj\.", "wkv."),
    (r"gate_proj\.", "wgate."),
    (r"kv_norm\.", "norm."),
    (r"position_bias$", "ape"),
)

_RULES: list[tuple[str, str]] = [
    # 1. whole-model leaves
    (r"^lm_head\.weight$", "head.weight"),
    (r"^model\.embed_tokens\.weight$", "embed.weight"),
    (r"^model\.norm\.weight$", "norm.weight"),
    (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
    # 2. the indexer (HF: self_attn.compressor.indexer.*; native: attn.indexer.*)
    (_L + r"self_attn\.compressor\.indexer\.scorer\.weights_proj\.",
     r"layers.\1.attn.indexer.weights_proj."),
    (_L + r"self_attn\.compressor\.indexer\.q_b_proj\.", r"layers.\1.attn.indexer.wq_b."),
    *[(_L + r"self_attn\.compressor\.indexer\." + src, r"layers.\1.attn.indexer.compressor." + dst)
      for src, dst in _COMPRESSOR_LEAF],
    # 3a. the attention compressor
    *[(_L + r"self_attn\.compressor\." + src, r"layers.\1.attn.compressor." + dst)
      for src, dst in _COMPRESSOR_LEAF],
    # 3b. attention projections, norms and sinks
    (_L + r"self_attn\.q_a_proj\.", r"layers.\1.attn.wq_a."),
    (_L + r"self_attn\.q_b_proj\.", r"layers.\1.attn.wq_b."),
    (_L + r"self_attn\.kv_proj\.", r"layers.\1.attn.wkv."),
    (_L + r"self_attn\.o_a_proj\.", r"layers.\1.attn.wo_a."),
    (_L + r"self_attn\.o_b_proj\.", r"layers.\1.attn.wo_b."),
    (_L + r"self_attn\.q_a_norm\.", r"layers.\1.attn.q_norm."),
    (_L + r"self_attn\.kv_norm\.", r"layers.\1.attn.kv_norm."),
    (_L + r"self_attn\.sinks$", r"layers.\1.attn.attn_sink"),
    # 3c. MoE: routed experts, shared experts, router
    *[(_L + r"mlp\.experts\.(\d+)\." + hf + r"\.", r"layers.\1.ffn.experts.\2." + nat + ".")
      for hf, nat in _MLP_PROJ.items()],
    *[(_L + r"mlp\.shared_experts\." + hf + r"\.", r"layers.\1.ffn.shared_experts." + nat + ".")
      for hf, nat in _MLP_PROJ.items()],
    (_L + r"mlp\.gate\.e_score_correction_bias$", r"layers.\1.ffn.gate.bias"),
    # 3d. per-layer norms and hyper-connections
    (_L + r"input_layernorm\.", r"layers.\1.attn_norm."),
    (_L + r"post_attention_layernorm\.", r"layers.\1.ffn_norm."),
    (_L + r"(attn|ffn)_hc\.(fn|base|scale)$", r"layers.\1.hc_\2_\3"),
    # 4. general module renames, then the prefix
    (_L + r"self_attn(?=\.|$)", r"layers.\1.attn"),
    (_L + r"mlp(?=\.|$)", r"layers.\1.ffn"),
    (_L, r"layers.\1."),
]

#: Ordered (compiled pattern, replacement) rules, HF-format name -> native name.
HF_TO_NATIVE: list[tuple[re.Pattern, str]] = [(re.compile(p), r) for p, r in _RULES]


def hf_to_native(name: str) -> str:
    """Rewrite one HF-format name to DeepSeek's native name (native names pass unchanged).

    The first matching rule wins. (Inside vLLM's mapper every rule is tried in turn, which is
    the same thing: each rule's output has lost the ``model.``/``lm_head.`` anchor that all
    rules need, so no second rule can match.)
    """
    for pattern, repl in HF_TO_NATIVE:
        new = pattern.sub(repl, name, count=1)
        if new != name:
            return new
    return name


def with_hf_names(mapper):
    """vLLM ``WeightsMapper`` that first rewrites HF-format names to native ones, then applies
    ``mapper`` (vLLM's DeepSeek-V4 mapper) unchanged."""
    hf_regex = {pattern: repl for pattern, repl in HF_TO_NATIVE}
    return dataclasses.replace(mapper, orig_to_new_regex={**hf_regex,
                                                         **mapper.orig_to_new_regex})
