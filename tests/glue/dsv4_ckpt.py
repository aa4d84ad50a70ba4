"""A tiny DeepSeek-V4 config and synthetic NVFP4 checkpoints, written the way real exports are,
plus an independent fp32 reference of one layer's ``ffn`` computed from the checkpoint tensors.

Three quantization families:

* ``"fp8"``: ``quant_method: fp8`` + ``moe_quant_algo: NVFP4`` (the official NVIDIA exports):
  routed experts NVFP4, shared experts block-FP8 (e4m3 weights, ue8m0 128x128 scales);
* ``"mxfp4"``: DeepSeek's own releases: ``quant_method: fp8`` with block-FP8 128x128 ue8m0
  scales and ``expert_dtype: "fp4"``, no ``moe_quant_algo``; routed experts MXFP4 stored as
  DeepSeek does (``...experts.E.wN.weight`` int8 ``[N, K/2]``, ``...wN.scale`` float8_e8m0fnu
  ``[N, K/32]``), shared experts block-FP8;
* ``"modelopt"``: ``quant_method: modelopt`` + ``quant_algo: NVFP4`` with an
  ``hf_quant_config.json``: routed *and* shared experts NVFP4, attention excluded.

Two naming styles: ``"native"`` (DeepSeek: ``layers.L.ffn.experts.E.w1.weight``) and ``"hf"``
(transformers / ModelOpt HF export: ``model.layers.L.mlp.experts.E.gate_proj.weight``).

The checkpoint holds the ``ffn`` of every layer (router, hash table / bias, routed and shared
experts); the glue changes nothing else in the model. Every NVFP4 projection gets its own
global scale, and ``gate_up_ratio`` makes the up projection's global scale that many times the
gate's (vLLM's stock method would apply the gate's to both).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch
from safetensors.torch import save_file

from nvfp4_ops.format import mxfp4_quantize, quantize

HIDDEN = 256
MOE_INTER = 128  # shared expert too (n_shared_experts=1); block-FP8 pads it to 128s
EXPERTS = 8
TOP_K = 2
VOCAB = 512
LAYERS = 2  # layer 0: hash-routed; layer 1: biased top-k
ROUTED_SCALING = 1.5
SWIGLU_LIMIT = 3.0  # small enough that the clamp clips many up (and a few gate) values

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def config_dict(family: str, naming: str = "native", quant_algo: str = "NVFP4") -> dict:
    from transformers import DeepseekV4Config

    cfg = DeepseekV4Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, moe_intermediate_size=MOE_INTER,
        num_hidden_layers=LAYERS, num_attention_heads=8, head_dim=512, q_lora_rank=128,
        num_experts_per_tok=TOP_K, n_routed_experts=EXPERTS, n_shared_experts=1,
        o_groups=2, o_lora_rank=128, index_n_heads=8, index_head_dim=128, index_topk=64,
        num_nextn_predict_layers=0, mlp_layer_types=["hash_moe", "moe"],
        layer_types=["sliding_attention", "compressed_sparse_attention"],
        max_position_embeddings=4096, routed_scaling_factor=ROUTED_SCALING,
        swiglu_limit=SWIGLU_LIMIT,
    ).to_dict()
    cfg["architectures"] = ["DeepseekV4ForCausalLM"]
    cfg["topk_method"] = "noaux_tc"
    cfg["torch_dtype"] = "bfloat16"
    if family == "fp8":
        cfg["expert_dtype"] = "fp4"
        cfg["quantization_config"] = {
            "quant_method": "fp8", "moe_quant_algo": "NVFP4", "activation_scheme": "dynamic",
            "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
        }
    elif family == "mxfp4":
        # As DeepSeek's DeepSeek-V4 config.json has it.
        cfg["expert_dtype"] = "fp4"
        cfg["quantization_config"] = {
            "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
        }
    elif family == "modelopt":
        # ModelOpt writes its settings both here and to hf_quant_config.json; vLLM reads this.
        q = hf_quant_config(naming, quant_algo)["quantization"]
        cfg["quantization_config"] = {
            "quant_method": "modelopt", "quant_algo": q["quant_algo"],
            "group_size": q["group_size"], "ignore": q["exclude_modules"],
            "producer": hf_quant_config(naming)["producer"],
        }
    else:
        raise ValueError(family)
    return cfg


def hf_quant_config(naming: str, quant_algo: str = "NVFP4") -> dict:
    """``hf_quant_config.json`` as ModelOpt writes it (the attention stays unquantized)."""
    layers = "model.layers.*.self_attn*" if naming == "hf" else "layers.*.attn*"
    return {
        "producer": {"name": "modelopt", "version": "0.40.0"},
        "quantization": {"quant_algo": quant_algo, "kv_cache_quant_algo": None, "group_size": 16,
                         "exclude_modules": [layers, "lm_head"]},
    }


@dataclass
class Nvfp4Proj:
    weight: torch.Tensor  # u8 [N, K/2]
    weight_scale: torch.Tensor  # e4m3 [N, K/16]
    weight_scale_2: torch.Tensor  # f32 []
    input_scale: torch.Tensor  # f32 []


def nvfp4_proj(out_f: int, in_f: int, gen: torch.Generator, std: float,
               global_scale: torch.Tensor | None = None) -> Nvfp4Proj:
    w = torch.randn(out_f, in_f, generator=gen) * std
    packed, scale, gs = quantize(w, global_scale)
    return Nvfp4Proj(packed, scale, gs.reshape(()).clone(), torch.tensor(0.01 + 0.001 * out_f))


@dataclass
class Mxfp4Proj:
    weight: torch.Tensor  # int8 [N, K/2] (DeepSeek stores the packed codes as int8)
    scale: torch.Tensor  # float8_e8m0fnu [N, K/32]


def mxfp4_proj(out_f: int, in_f: int, gen: torch.Generator, std: float,
               row_binades: int = 0, block_binades: int = 0) -> Mxfp4Proj:
    """Gaussian weights times 2^-r per row (r < ``row_binades``) and 2^-b per 32-block
    (b < ``block_binades``), quantized to MXFP4: the block exponents of one tensor then spread
    over about ``row_binades + block_binades`` binades."""
    w = torch.randn(out_f, in_f, generator=gen) * std
    r = torch.randint(0, max(row_binades, 1), (out_f, 1, 1), generator=gen).float()
    b = torch.randint(0, max(block_binades, 1), (out_f, in_f // 32, 1), generator=gen).float()
    w = (w.reshape(out_f, in_f // 32, 32) * torch.exp2(-r - b)).reshape(out_f, in_f)
    packed, scale = mxfp4_quantize(w)
    return Mxfp4Proj(packed.view(torch.int8), scale.view(torch.float8_e8m0fnu))


def dequant_mxfp4(p: Mxfp4Proj) -> torch.Tensor:
    """Independent MXFP4 dequantization (own LUT, own nibble order, scale from its exponent
    byte with ldexp): fp32 ``[N, K]``."""
    lut = torch.tensor(_E2M1 + tuple(-v for v in _E2M1))
    codes = p.weight.view(torch.uint8)
    lo, hi = (codes & 0xF).long(), (codes >> 4).long()
    vals = torch.stack((lut[lo], lut[hi]), dim=-1).reshape(codes.shape[0], -1)
    exps = p.scale.view(torch.uint8).int() - 127
    return torch.ldexp(vals, exps.repeat_interleave(32, dim=1).float())


def fp8_block_proj(out_f: int, in_f: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Block-FP8 weight (e4m3) and its ue8m0 128x128 scales, as DeepSeek stores them."""
    nb, kb = math.ceil(out_f / 128), math.ceil(in_f / 128)
    exps = torch.randint(-11, -9, (nb, kb), generator=gen).float()  # weights ~ N(0, 0.03^2)
    codes = (torch.randn(out_f, in_f, generator=gen) * 60).clamp(-448, 448)
    return codes.to(torch.float8_e4m3fn), torch.exp2(exps).to(torch.float8_e8m0fnu)


def dequant_nvfp4(p: Nvfp4Proj) -> torch.Tensor:
    """Independent dequantization (own LUT, own nibble order): fp32 ``[N, K]``."""
    lut = torch.tensor(_E2M1 + tuple(-v for v in _E2M1))
    lo, hi = (p.weight & 0xF).long(), (p.weight >> 4).long()
    vals = torch.stack((lut[lo], lut[hi]), dim=-1).reshape(p.weight.shape[0], -1)
    return vals * p.weight_scale.float().repeat_interleave(16, dim=1) * p.weight_scale_2.float()


def dequant_fp8_block(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    full = s.float().repeat_interleave(128, 0).repeat_interleave(128, 1)
    return w.float() * full[: w.shape[0], : w.shape[1]]


class Checkpoint:
    """Synthetic checkpoint tensors (by native role) plus the writer for both naming styles."""

    def __init__(self, family: str, seed: int, gate_up_ratio: float = 4.0,
                 quant_algo: str = "NVFP4", row_binades: int = 14, block_binades: int = 8):
        """``row_binades`` / ``block_binades``: the MXFP4 family's exponent spread (see
        :func:`mxfp4_proj`); the defaults spread each expert tensor over >= 20 binades while
        every row stays within the 18 that one NVFP4 global scale per row holds."""
        self.family = family
        self.quant_algo = quant_algo  # ModelOpt family: "NVFP4" (W4A4) or "W4A16_NVFP4"
        gen = torch.Generator().manual_seed(seed)
        self.layers = []
        for layer in range(LAYERS):
            entry: dict = {"gate": (torch.randn(EXPERTS, HIDDEN, generator=gen) * 0.5)
                           .to(torch.bfloat16)}
            if layer == 0:
                entry["tid2eid"] = torch.stack(
                    [torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(VOCAB)]
                ).to(torch.int32)
            else:
                entry["bias"] = torch.randn(EXPERTS, generator=gen) * 0.1
            experts = []
            for _ in range(EXPERTS if family != "mxfp4" else 0):
                # The up projection: values and global scale exactly gate_up_ratio x the gate's.
                w1 = nvfp4_proj(MOE_INTER, HIDDEN, gen, 0.06)
                experts.append({
                    "w1": w1,
                    "w3": nvfp4_proj(MOE_INTER, HIDDEN, gen, 0.06 * gate_up_ratio,
                                     w1.weight_scale_2 * gate_up_ratio),
                    "w2": nvfp4_proj(HIDDEN, MOE_INTER, gen, 0.05),
                })
            if family == "mxfp4":
                spread = dict(row_binades=row_binades, block_binades=block_binades)
                experts = [{"w1": mxfp4_proj(MOE_INTER, HIDDEN, gen, 0.06, **spread),
                            "w3": mxfp4_proj(MOE_INTER, HIDDEN, gen, 0.06 * gate_up_ratio,
                                             **spread),
                            "w2": mxfp4_proj(HIDDEN, MOE_INTER, gen, 0.05, **spread)}
                           for _ in range(EXPERTS)]
            entry["experts"] = experts
            if family in ("fp8", "mxfp4"):
                entry["shared"] = {
                    "w1": fp8_block_proj(MOE_INTER, HIDDEN, gen),
                    "w3": fp8_block_proj(MOE_INTER, HIDDEN, gen),
                    "w2": fp8_block_proj(HIDDEN, MOE_INTER, gen),
                }
            else:
                s1 = nvfp4_proj(MOE_INTER, HIDDEN, gen, 0.05)
                entry["shared"] = {
                    "w1": s1,
                    "w3": nvfp4_proj(MOE_INTER, HIDDEN, gen, 0.05 * gate_up_ratio,
                                     s1.weight_scale_2 * gate_up_ratio),
                    "w2": nvfp4_proj(HIDDEN, MOE_INTER, gen, 0.04),
                }
            self.layers.append(entry)

    # --- writing -----------------------------------------------------------------------------

    def tensors(self, naming: str) -> dict[str, torch.Tensor]:
        hf = naming == "hf"
        proj = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
        out: dict[str, torch.Tensor] = {}
        for layer, entry in enumerate(self.layers):
            ffn = f"model.layers.{layer}.mlp" if hf else f"layers.{layer}.ffn"
            out[f"{ffn}.gate.weight"] = entry["gate"]
            if "tid2eid" in entry:
                out[f"{ffn}.gate.tid2eid"] = entry["tid2eid"]
            if "bias" in entry:
                out[f"{ffn}.gate.{'e_score_correction_bias' if hf else 'bias'}"] = entry["bias"]
            for e, ex in enumerate(entry["experts"]):
                for w, p in ex.items():
                    base = f"{ffn}.experts.{e}.{proj[w] if hf else w}"
                    if isinstance(p, Mxfp4Proj):
                        out[f"{base}.weight"] = p.weight
                        out[f"{base}.scale"] = p.scale
                        continue
                    out[f"{base}.weight"] = p.weight
                    out[f"{base}.weight_scale"] = p.weight_scale
                    out[f"{base}.weight_scale_2"] = p.weight_scale_2
                    out[f"{base}.input_scale"] = p.input_scale
            for w, p in entry["shared"].items():
                base = f"{ffn}.shared_experts.{proj[w] if hf else w}"
                if self.family in ("fp8", "mxfp4"):
                    out[f"{base}.weight"] = p[0]
                    out[f"{base}.{'weight_scale_inv' if hf else 'scale'}"] = p[1]
                else:
                    out[f"{base}.weight"] = p.weight
                    out[f"{base}.weight_scale"] = p.weight_scale
                    out[f"{base}.weight_scale_2"] = p.weight_scale_2
                    out[f"{base}.input_scale"] = p.input_scale
        return out

    def write(self, directory: str, naming: str) -> dict[str, torch.Tensor]:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(config_dict(self.family, naming, self.quant_algo), f, indent=1)
        if self.family == "modelopt":
            with open(os.path.join(directory, "hf_quant_config.json"), "w") as f:
                json.dump(hf_quant_config(naming, self.quant_algo), f, indent=1)
        tensors = self.tensors(naming)
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  os.path.join(directory, "model.safetensors"))
        return tensors

    # --- the independent reference ------------------------------------------------------------

    def route(self, layer: int, x: torch.Tensor, input_ids: torch.Tensor):
        """DeepSeek-V4 routing in fp32 from the checkpoint: sqrt(softplus(logits)) scores;
        hash layer: ids from tid2eid[input_ids]; else top-k of scores + bias; weights =
        chosen scores renormalised, times routed_scaling_factor. Also returns the top-k margin
        (k-th minus (k+1)-th biased score) so tests can avoid ties."""
        entry = self.layers[layer]
        logits = x.float() @ entry["gate"].float().t()
        scores = torch.sqrt(torch.nn.functional.softplus(logits))
        if "tid2eid" in entry:
            ids = entry["tid2eid"][input_ids].long()
            margin = torch.full((x.shape[0],), float("inf"))
        else:
            biased = scores + entry["bias"]
            top = biased.topk(TOP_K + 1, dim=-1)
            ids = top.indices[:, :TOP_K]
            margin = top.values[:, TOP_K - 1] - top.values[:, TOP_K]
        w = scores.gather(1, ids)
        w = w / w.sum(-1, keepdim=True) * ROUTED_SCALING
        return ids, w, margin

    def routed_reference(self, layer: int, x: torch.Tensor, ids, weights,
                         gate_scale_for_up: bool = False,
                         bf16_activation: bool = False) -> torch.Tensor:
        """fp32 routed-experts output. ``gate_scale_for_up`` reproduces vLLM's stock choice
        (the gate's global scale on both halves), to show a test can tell them apart;
        ``bf16_activation`` rounds the SwiGLU output to bf16 before the down projection, as
        the nvfp4 ops' numerics contract (and every bf16 kernel) does."""
        out = torch.zeros(x.shape[0], HIDDEN)
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                ex = self.layers[layer]["experts"][int(ids[t, j])]
                up = ex["w3"]
                if gate_scale_for_up:
                    up = Nvfp4Proj(up.weight, up.weight_scale, ex["w1"].weight_scale_2,
                                   up.input_scale)
                out[t] += weights[t, j] * _swiglu_mlp(x[t : t + 1].float(),
                                                      dequant(ex["w1"]),
                                                      dequant(up),
                                                      dequant(ex["w2"]),
                                                      bf16_activation)[0]
        return out

    def shared_reference(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        sh = self.layers[layer]["shared"]
        deq = ((lambda p: dequant_fp8_block(*p)) if self.family in ("fp8", "mxfp4")
               else dequant_nvfp4)
        return _swiglu_mlp(x.float(), deq(sh["w1"]), deq(sh["w3"]), deq(sh["w2"]))


def dequant(p) -> torch.Tensor:
    """A routed expert projection of either format, dequantized independently to fp32."""
    return dequant_mxfp4(p) if isinstance(p, Mxfp4Proj) else dequant_nvfp4(p)


def _swiglu_mlp(x, w1, w3, w2, bf16_activation=False):
    gate, up = x @ w1.t(), x @ w3.t()
    h = torch.nn.functional.silu(gate.clamp(max=SWIGLU_LIMIT)) * up.clamp(-SWIGLU_LIMIT,
                                                                          SWIGLU_LIMIT)
    if bf16_activation:
        h = h.to(torch.bfloat16).float()
    return h @ w2.t()


EXPERT_SUFFIXES = ("weight", "weight_scale", "weight_scale_2", "input_scale")


def transformers_hf_keys() -> list[str]:
    """transformers' state-dict keys for this tiny DeepSeek-V4, with the fused expert tensors
    replaced by the per-expert names ModelOpt HF exports use (REFERENCE section 7)."""
    import transformers

    cfg_dict = config_dict("fp8")
    fields = transformers.DeepseekV4Config().to_dict().keys()
    cfg = transformers.DeepseekV4Config(**{k: v for k, v in cfg_dict.items()
                                           if k in fields and k != "quantization_config"})
    with torch.device("meta"):
        model = transformers.DeepseekV4ForCausalLM(cfg)
    keys = []
    for key in model.state_dict():
        if key.endswith(".mlp.experts.gate_up_proj"):
            base = key.removesuffix(".gate_up_proj")
            keys += [f"{base}.{e}.{p}.{s}" for e in range(EXPERTS)
                     for p in ("gate_proj", "up_proj") for s in EXPERT_SUFFIXES]
        elif key.endswith(".mlp.experts.down_proj"):
            base = key.removesuffix(".down_proj")
            keys += [f"{base}.{e}.down_proj.{s}" for e in range(EXPERTS)
                     for s in EXPERT_SUFFIXES]
        else:
            keys.append(key)
    assert any(".compressor.indexer." in k for k in keys)  # the tiny model has all parts
    return keys
