"""Load-time weight preparation (``nvfp4_ops.prepare``), the vLLM glue's post-load step as plain
functions: on tensors with exactly the shapes, dtypes and layouts of vLLM's ModelOpt NVFP4 and
MXFP4 parameters, prepared in place, then the ops vs the reference on the untouched checkpoint
tensors. CPU (references) and GPU (the CUDA kernels, the prepared orders)."""

from __future__ import annotations

import pytest
import torch

import nvfp4_ops
from nvfp4_ops import format as fmt
from nvfp4_ops.prepare import prepare_linear, prepare_moe, prepare_mxfp4_moe
from nvfp4_ops.reference import linear_reference, moe_reference
from nvfp4_ops.testing import random_routing, rel_l2

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
#: V4-Flash sizes (H, I) with few experts: the GPU kernels' tiles and orders are those of the
#: real layer, the test stays small
H, INTER, E, TOPK = 4096, 2048, 8, 6


def _device(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return device


def _nvfp4(rows, k, gen, device, std=0.02):
    w = torch.randn(rows, k, generator=gen) * std
    packed, scale, gs = fmt.quantize(w.to(torch.bfloat16))
    return packed.to(device), scale.to(device), gs.to(device)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_linear_prepared_in_place(device):
    """A fused projection (vLLM's ``gate_up_proj``: two shards, each its own
    ``weight_scale_2``): per-row global scales, the codes reordered in place on CUDA, the op
    equal to the reference on the checkpoint tensors."""
    device = _device(device)
    gen = torch.Generator().manual_seed(1)
    shards = [_nvfp4(2048, H, gen, device, std) for std in (0.02, 0.08)]
    weight = torch.cat([s[0] for s in shards]).contiguous()  # vLLM: [N, K/2] uint8
    weight_scale = torch.cat([s[1] for s in shards]).contiguous()  # [N, K/16] e4m3
    weight_scale_2 = torch.stack([s[2] for s in shards])  # [S] fp32
    checkpoint = weight.clone()
    ptr = weight.data_ptr()
    global_scale, wfrag = prepare_linear(weight, weight_scale, weight_scale_2, [2048, 2048],
                                         where="layers.0.ffn.shared_experts.gate_up_proj")
    assert wfrag == (device == "cuda") and weight.data_ptr() == ptr
    assert torch.equal(weight, checkpoint) != wfrag
    assert global_scale.shape == (4096,) and torch.equal(
        global_scale, weight_scale_2.repeat_interleave(2048))
    x = torch.randn(7, H, generator=gen).to(torch.bfloat16)
    got = nvfp4_ops.linear(x.to(device), weight, weight_scale, global_scale, wfrag=wfrag)
    want = linear_reference(x, checkpoint.cpu(), weight_scale.cpu(), global_scale.cpu())
    assert rel_l2(got.cpu(), want) < 4e-3


def test_prepare_linear_refuses_before_touching_anything():
    gen = torch.Generator().manual_seed(2)
    w, s, g = _nvfp4(64, 256, gen, "cpu")
    before = w.clone()
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="shard widths"):
        prepare_linear(w, s, torch.stack([g, g]), [32, 16], wfrag=True)
    bad = s.clone()
    bad.view(torch.uint8)[3, 1] = 0x7F  # an e4m3 NaN
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="weight_scale"):
        prepare_linear(w, bad, g, wfrag=True, where="layer.x")
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="global_scale"):
        prepare_linear(w, s, torch.zeros(()), wfrag=True)
    assert torch.equal(w, before)


def _experts(gen, device):
    w13, s13, g13, w2, s2, g2 = [], [], [], [], [], []
    for _ in range(E):
        parts = [_nvfp4(INTER, H, gen, device, std) for std in (0.02, 0.05)]
        w13.append(torch.cat([p[0] for p in parts]))
        s13.append(torch.cat([p[1] for p in parts]))
        g13.append(torch.stack([p[2] for p in parts]))
        d = _nvfp4(H, INTER, gen, device)
        w2.append(d[0])
        s2.append(d[1])
        g2.append(d[2])
    # vLLM's ModelOpt parameters: [E, 2I, H/2] u8, [E, 2I, H/16] e4m3, [E, 2] f32, [E, H, I/2],
    # [E, H, I/16], [E], each one contiguous tensor
    return [torch.stack(t).contiguous() for t in (w13, s13, g13, w2, s2, g2)]


def test_prepare_moe_refuses_before_touching_anything():
    """A NaN block scale, a non-positive global scale or weights that cannot be reordered in
    place (not contiguous) stop ``prepare_moe`` with an error naming the layer and the tensor,
    before any code is permuted."""
    from nvfp4_ops.testing import fast_random_experts

    w13, s13, g13, w2, s2, g2 = fast_random_experts(2, 256, 128).args()
    before = [w13.clone(), w2.clone()]
    bad = s13.clone()
    bad.view(torch.uint8)[1, 5, 3] = 0x7F  # an e4m3 NaN
    with pytest.raises(nvfp4_ops.NVFP4InputError, match=r"layers\.7\.ffn.*w13_scale"):
        prepare_moe(w13, bad, g13, w2, s2, g2, wperm=True, where="layers.7.ffn.experts")
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="w2_global"):
        prepare_moe(w13, s13, g13, w2, s2, torch.zeros_like(g2), wperm=True)
    strided = torch.empty(2, 256, 128, dtype=torch.uint8)[:, :, :64]
    strided.copy_(w2)
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="w2 must be contiguous"):
        prepare_moe(w13, s13, g13, strided, s2, g2, wperm=True)
    assert torch.equal(w13, before[0]) and torch.equal(w2, before[1])


def _routing(num_tokens, device, gen):
    ids, weights = random_routing(num_tokens, E, TOPK)
    x = torch.randn(num_tokens, H, generator=gen).to(torch.bfloat16)
    return x, ids, weights


@pytest.mark.parametrize("device", DEVICES)
def test_nvfp4_experts_prepared_in_place(device):
    device = _device(device)
    gen = torch.Generator().manual_seed(3)
    experts = _experts(gen, device)
    checkpoint = [t.clone().cpu() for t in experts]
    ptrs = [t.data_ptr() for t in experts]
    wperm = prepare_moe(*experts, where="layers.3.ffn.experts")
    assert wperm == (device == "cuda")
    assert [t.data_ptr() for t in experts] == ptrs
    for t in (1, 37, 300):
        x, ids, weights = _routing(t, device, gen)
        got = nvfp4_ops.moe(x.to(device), ids.to(device), weights.to(device), *experts,
                            global_num_experts=E, swiglu_limit=10.0, wperm=wperm)
        want = moe_reference(x, ids, weights, *checkpoint, 0, 10.0, 1.0)
        assert not got.isnan().any() and rel_l2(got.cpu(), want) < 4e-3, f"T={t}"


@pytest.mark.parametrize("device", DEVICES)
def test_mxfp4_experts_prepared(device):
    """vLLM's MXFP4 parameters (uint8 codes, uint8 UE8M0 scales per 32): converted exactly,
    the codes reordered in place on CUDA, the op vs an MXFP4-dequantized reference."""
    device = _device(device)
    gen = torch.Generator().manual_seed(4)
    w13, s13 = fmt.mxfp4_quantize(torch.randn(E, 2 * INTER, H, generator=gen) * 0.03)
    w2, s2 = fmt.mxfp4_quantize(torch.randn(E, H, INTER, generator=gen) * 0.03)
    ref_w13 = fmt.mxfp4_dequantize(w13, s13)
    ref_w2 = fmt.mxfp4_dequantize(w2, s2)
    w13, s13, w2, s2 = (t.to(device).contiguous() for t in (w13, s13, w2, s2))
    n13, g13, n2, g2, wperm = prepare_mxfp4_moe(w13, s13, w2, s2, where="layers.5.ffn.experts")
    assert wperm == (device == "cuda")
    grouped = n13.dtype == torch.float8_e8m0fnu  # native (CUDA): one global per expert half
    assert g13.shape == ((E, 2) if grouped else (E, 2 * INTER))
    assert g2.shape == ((E,) if grouped else (E, H))
    x, ids, weights = _routing(19, device, gen)
    got = nvfp4_ops.moe(x.to(device), ids.to(device), weights.to(device), w13, n13, g13, w2,
                        n2, g2, global_num_experts=E, swiglu_limit=10.0, wperm=wperm)
    # independent reference: bf16 matmuls on the MXFP4-dequantized weights (exact in bf16)
    want = torch.zeros(19, H)
    for t in range(19):
        for j in range(TOPK):
            e = int(ids[t, j])
            h = x[t:t + 1].float() @ ref_w13[e].T
            gate, up = h[:, :INTER].clamp(max=10.0), h[:, INTER:].clamp(-10.0, 10.0)
            act = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16).float()
            want[t] += float(weights[t, j]) * (act @ ref_w2[e].T)[0]
    assert not got.isnan().any() and rel_l2(got.cpu(), want) < 6e-3
