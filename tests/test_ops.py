"""The quartet for every op on the CPU: opcheck, eager vs an independent reference,
torch.compile(fullgraph=True) with a dynamic token count vs eager (CUDA graphs: GPU tests)."""

from __future__ import annotations

import pytest
import torch

import nvfp4_ops
from nvfp4_ops import format as fmt
from nvfp4_ops.testing import (
    moe_bf16_dequantized,
    random_experts,
    random_nvfp4,
    random_routing,
    rel_l2,
)

H, INTER, E, TOPK = 128, 64, 8, 3


def _bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in bf16 units in the last place (same-sign finite values)."""
    ai = a.view(torch.int16).int()
    bi = b.view(torch.int16).int()
    return int((ai - bi).abs().max()) if a.numel() else 0


# ---------------------------------------------------------------- independent fp64 references


def _linear_fp64(x, packed, scale, gs, bias=None):
    w = fmt.decode(packed, scale).double()
    y = (x.double() @ w.T) * gs.double()
    return y if bias is None else y + bias.double()


def _gated_fp64(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, limit):
    inter = w13.shape[0] // 2
    # (gate, up) scales [2], or one per row [2I]
    g_gate, g_up = (w13_global[0], w13_global[1]) if w13_global.numel() == 2 else (
        w13_global[:inter], w13_global[inter:])
    gate = _linear_fp64(x, w13[:inter], w13_scale[:inter], g_gate)
    up = _linear_fp64(x, w13[inter:], w13_scale[inter:], g_up)
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(-limit, limit)
    act = (gate * torch.sigmoid(gate) * up).to(torch.bfloat16)  # the one bf16 intermediate
    return _linear_fp64(act, w2, w2_scale, w2_global)


def _moe_fp64(x, ids, weights, ex, start, limit, scale):
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) - start
            if 0 <= e < ex.num_experts:
                y = _gated_fp64(x[t:t + 1], ex.w13[e], ex.w13_scale[e], ex.w13_global[e],
                                ex.w2[e], ex.w2_scale[e], ex.w2_global[e], limit)
                out[t] += float(weights[t, j]) * y[0]
    return out * scale


def _opcheck(op, args):
    """opcheck with every default test util. Block scales are passed as their uint8 bytes
    there, because torch's SchemaCheckMode (test_schema) cannot compare float8 tensors
    ("mul_cpu_reduced_float not implemented for Float8_e4m3fn"); the float8 form then runs
    every other util."""
    as_bytes = tuple(a.view(torch.uint8) if isinstance(a, torch.Tensor)
                     and a.dtype == torch.float8_e4m3fn else a for a in args)
    torch.library.opcheck(op, as_bytes)
    if any(a is not b for a, b in zip(as_bytes, args, strict=True)):
        utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
        torch.library.opcheck(op, args, test_utils=utils)


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def dense():
    torch.manual_seed(10)
    packed, scale, gs = random_nvfp4(96, H)
    return packed, scale, gs


@pytest.fixture(scope="module")
def experts():
    torch.manual_seed(11)
    return random_experts(E, H, INTER, up_scale_ratio=4.0)


def _x(m, k=H):
    return torch.randn(m, k).to(torch.bfloat16)


# ---------------------------------------------------------------- quantize / dequantize


def test_quantize_op_matches_format_bitwise():
    x = _x(7, 64)
    got = nvfp4_ops.quantize(x)
    want = fmt.quantize(x)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8))
    assert torch.equal(nvfp4_ops.dequantize(*got), fmt.dequantize(*want))


def test_opcheck_quantize_dequantize():
    x = _x(5, 64)
    _opcheck(torch.ops.nvfp4.quantize.default, (x, None))
    _opcheck(torch.ops.nvfp4.quantize.default, (x, torch.tensor(0.01)))
    p, s, g = fmt.quantize(x)
    _opcheck(torch.ops.nvfp4.dequantize.default, (p, s, g))
    _opcheck(torch.ops.nvfp4.dequantize.default, (p, s, torch.rand(5) + 0.5))


# ---------------------------------------------------------------- linear


@pytest.mark.parametrize("m", [0, 1, 7, 33])
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_eager_vs_fp64(dense, m, per_row, with_bias):
    packed, scale, gs = dense
    if per_row:
        gs = gs * (torch.rand(packed.shape[0]) + 0.5)
    bias = torch.randn(packed.shape[0]).to(torch.bfloat16) if with_bias else None
    x = _x(m)
    out = torch.empty(0)
    out = nvfp4_ops.linear(x, packed, scale, gs, bias)
    assert out.shape == (m, packed.shape[0]) and out.dtype == torch.bfloat16
    want = _linear_fp64(x, packed, scale, gs, bias).to(torch.bfloat16)
    assert _bf16_ulps(out, want) <= 1


def test_linear_opcheck(dense):
    packed, scale, gs = dense
    _opcheck(torch.ops.nvfp4.linear.default, (_x(5), packed, scale, gs, None))
    bias = torch.randn(packed.shape[0]).to(torch.bfloat16)
    per_row = gs * (torch.rand(packed.shape[0]) + 0.5)
    _opcheck(torch.ops.nvfp4.linear.default, (_x(3), packed, scale, per_row, bias))


def test_linear_compiled_dynamic_matches_eager(dense):
    packed, scale, gs = dense
    fn = torch.compile(lambda x: nvfp4_ops.linear(x, packed, scale, gs), fullgraph=True,
                       dynamic=True)
    for m in (3, 17, 64):
        x = _x(m)
        torch._dynamo.mark_dynamic(x, 0)
        assert torch.equal(fn(x), nvfp4_ops.linear(x, packed, scale, gs))


# ---------------------------------------------------------------- mlp


def _shared(ex):
    return (ex.w13[0], ex.w13_scale[0], ex.w13_global[0], ex.w2[0], ex.w2_scale[0],
            ex.w2_global[0])


@pytest.mark.parametrize("limit", [None, 10.0, 0.05])
def test_mlp_eager_vs_fp64(experts, limit):
    x = _x(9)
    out = nvfp4_ops.mlp(x, *_shared(experts), swiglu_limit=limit)
    want = _gated_fp64(x, *_shared(experts), limit)
    assert rel_l2(out, want) < 4e-3  # bf16 output rounding only
    assert _bf16_ulps(out, want.to(torch.bfloat16)) <= 2


def test_mlp_opcheck(experts):
    _opcheck(torch.ops.nvfp4.mlp.default, (_x(4), *_shared(experts), 10.0))
    _opcheck(torch.ops.nvfp4.mlp.default, (_x(2), *_shared(experts), None))


def test_mlp_compiled_dynamic_matches_eager(experts):
    args = _shared(experts)
    fn = torch.compile(lambda x: nvfp4_ops.mlp(x, *args, swiglu_limit=10.0), fullgraph=True,
                       dynamic=True)
    for m in (2, 11):
        x = _x(m)
        torch._dynamo.mark_dynamic(x, 0)
        assert torch.equal(fn(x), nvfp4_ops.mlp(x, *args, swiglu_limit=10.0))


# ---------------------------------------------------------------- moe


def _moe(x, ids, w, ex, start=0, limit=10.0, scale=1.5, global_e=-1):
    return nvfp4_ops.moe(x, ids, w, *ex.args(), expert_start=start, global_num_experts=global_e,
                         swiglu_limit=limit, output_scale=scale)


@pytest.mark.parametrize("num_tokens", [1, 7, 40])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_moe_eager_vs_fp64(experts, num_tokens, ids_dtype):
    x = _x(num_tokens)
    ids, w = random_routing(num_tokens, E, TOPK, dtype=ids_dtype)
    out = _moe(x, ids, w, experts)
    want = _moe_fp64(x, ids, w, experts, 0, 10.0, 1.5)
    assert rel_l2(out, want) < 4e-3
    assert _bf16_ulps(out, want.to(torch.bfloat16)) <= 2
    base = moe_bf16_dequantized(x, ids, w, experts, swiglu_limit=10.0, output_scale=1.5)
    assert rel_l2(out, base) < 1e-2


def test_moe_expert_parallel_drops_non_local_ids(experts):
    """Rank owning global experts [16, 24): other ids contribute nothing; a token with no
    local expert gets exactly 0."""
    start = 16
    x = _x(6)
    ids = torch.tensor([[16, 3, 23], [0, 1, 2], [17, 17 + 8, 40], [24, 15, 18],
                        [20, 21, 22], [2, 30, 5]], dtype=torch.int32)
    w = torch.rand(6, 3)
    out = _moe(x, ids, w, experts, start=start, global_e=64)
    want = _moe_fp64(x, ids, w, experts, start, 10.0, 1.5)
    assert rel_l2(out, want) < 4e-3
    for t in (1, 5):  # tokens with no local expert
        assert torch.equal(out[t], torch.zeros_like(out[t]))
    assert out[0].abs().sum() > 0


def test_moe_all_tokens_to_one_expert_and_empty_experts(experts):
    x = _x(13)
    ids = torch.full((13, TOPK), 5, dtype=torch.int32)
    ids[:, 1] = 2
    ids[:, 2] = 5  # the same expert twice for one token counts twice
    w = torch.rand(13, TOPK)
    out = _moe(x, ids, w, experts)
    assert rel_l2(out, _moe_fp64(x, ids, w, experts, 0, 10.0, 1.5)) < 4e-3


def test_moe_zero_tokens(experts):
    out = _moe(_x(0), torch.empty(0, TOPK, dtype=torch.int32), torch.empty(0, TOPK), experts)
    assert out.shape == (0, H)


def test_moe_gate_and_up_scales_are_not_folded(experts):
    """Up's global scale is 4x gate's in this fixture; using one for both must differ."""
    g = experts.w13_global
    assert torch.all(g[:, 1] / g[:, 0] > 2.5)
    x = _x(5)
    ids, w = random_routing(5, E, TOPK)
    out = _moe(x, ids, w, experts)
    folded = type(experts)(**{**experts.__dict__,
                              "w13_global": g[:, :1].expand(-1, 2).contiguous()})
    assert rel_l2(_moe(x, ids, w, folded), out) > 0.5


def test_moe_opcheck(experts):
    x = _x(6)
    ids, w = random_routing(6, E, TOPK)
    _opcheck(torch.ops.nvfp4.moe.default,
                          (x, ids, w, *experts.args(), 0, E, 10.0, 1.5))
    _opcheck(torch.ops.nvfp4.moe.default,
                          (x, ids.long() + 4, w, *experts.args(), 4, -1, None, 1.0))


def test_moe_compiled_dynamic_matches_eager(experts):
    def f(x, ids, w):
        return _moe(x, ids, w, experts)

    fn = torch.compile(f, fullgraph=True, dynamic=True)
    for t in (3, 19, 50):
        x = _x(t)
        ids, w = random_routing(t, E, TOPK)
        for a in (x, ids, w):
            torch._dynamo.mark_dynamic(a, 0)
        assert torch.equal(fn(x, ids, w), f(x, ids, w))


# ---------------------------------------------------------------- per-row global scales


def _per_row(ex, gen):
    """The fixture's experts with one random global scale per weight row (what an exact MXFP4
    conversion produces): ``w13_global [E, 2I]``, ``w2_global [E, H]``."""
    e, two_i, _ = ex.w13.shape
    hidden = ex.w2.shape[1]
    g13 = ex.w13_global.repeat_interleave(two_i // 2, dim=1)
    g13 = g13 * torch.rand(e, two_i, generator=gen).add(0.5)
    g2 = ex.w2_global.unsqueeze(1) * torch.rand(e, hidden, generator=gen).add(0.5)
    return type(ex)(**{**ex.__dict__, "w13_global": g13, "w2_global": g2})


def test_moe_and_mlp_per_row_global_scales_vs_fp64(experts):
    rows = _per_row(experts, torch.Generator().manual_seed(3))
    x = _x(11)
    ids, w = random_routing(11, E, TOPK)
    out = _moe(x, ids, w, rows)
    want = _moe_fp64(x, ids, w, rows, 0, 10.0, 1.5)  # _linear_fp64 broadcasts [N] globals
    assert rel_l2(out, want) < 4e-3
    assert _bf16_ulps(out, want.to(torch.bfloat16)) <= 2
    mlp_out = nvfp4_ops.mlp(x, *_shared(rows), swiglu_limit=10.0)
    assert _bf16_ulps(mlp_out, _gated_fp64(x, *_shared(rows), 10.0).to(torch.bfloat16)) <= 2
    _opcheck(torch.ops.nvfp4.moe.default, (x, ids, w, *rows.args(), 0, E, 10.0, 1.5))


def test_per_row_global_scales_equal_expanded_per_expert_scales(experts):
    """Per-row scales holding each expert's (gate, up) / down scale on every row give bitwise
    the result of the per-expert form."""
    inter, hidden = experts.w13.shape[1] // 2, experts.w2.shape[1]
    expanded = type(experts)(**{
        **experts.__dict__,
        "w13_global": experts.w13_global.repeat_interleave(inter, dim=1),
        "w2_global": experts.w2_global.unsqueeze(1).expand(-1, hidden).contiguous()})
    x = _x(7)
    ids, w = random_routing(7, E, TOPK)
    assert torch.equal(_moe(x, ids, w, expanded), _moe(x, ids, w, experts))
