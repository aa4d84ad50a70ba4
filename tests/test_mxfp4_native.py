"""MXFP4 scales in the form the MoE kernels read natively (one UE8M0 byte per 32 k, rebased per
row into ``format.MXFP4_KERNEL_SCALE_BYTES``, one fp32 global scale per row), on the CPU: the
rebase is exact and refuses what it cannot hold, ``nvfp4::moe`` takes the form (op, fake,
checks) and gives bitwise the result of the NVFP4 conversion, the dispatch plans the kernels'
``mx`` variants, the load-time preparation and its switch. The variants' compile and PTX facts
are in ``test_kernels_compile.py``; the GPU runs in ``test_mxfp4_gpu.py``."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import nvfp4_ops
from nvfp4_ops import format as fmt
from nvfp4_ops.kernels import dispatch
from nvfp4_ops.testing import random_routing, spread_mxfp4

E8M0 = torch.float8_e8m0fnu
LO, HI = fmt.MXFP4_KERNEL_SCALE_BYTES


def _check_exact(packed, scale, kernel_scale, glob):
    assert kernel_scale.dtype == E8M0 and kernel_scale.shape == scale.shape
    assert glob.dtype == torch.float32 and glob.shape == scale.shape[:-1]
    b = kernel_scale.view(torch.uint8)
    assert int(b.min()) >= LO and int(b.max()) <= HI
    got = fmt.dequantize(packed, kernel_scale, glob)
    want = fmt.mxfp4_dequantize(packed, scale)
    assert torch.equal(got, want), f"{int((got != want).sum())} values differ"


# ---------------------------------------------------------------- the rebase


def test_rebase_exact_over_127_binades_per_row():
    """Rows whose non-zero blocks span the whole 127 binades the window holds, top exponents
    spread over ~200 binades across the tensor: dequantized bitwise the MXFP4 weights."""
    gen = torch.Generator().manual_seed(1)
    packed, scale = spread_mxfp4((3, 24, 8192), gen, row_lo=-2, row_hi=126, span=127)
    # the UE8M0 edge codes 0x00 (2^-127) and 0xFE (2^127, magnitudes < 2: no fp32 overflow)
    scale[0, 0, :] = 0
    scale[0, 0, 1] = 126
    scale[0, 1, :] = 0xFE
    scale[0, 1, 1] = 0xFE - 126
    packed[0, 1] &= 0x33
    kernel_scale, glob = nvfp4_ops.mxfp4_kernel_scales(packed, scale, name="w13")
    _check_exact(packed, scale, kernel_scale, glob)
    e = scale.int() - 127
    assert int(e.max() - e.min()) >= 200
    mant, _ = torch.frexp(glob)
    assert (mant == 0.5).all()  # powers of two


def test_rebase_is_the_conversion_rule():
    """Where the NVFP4 conversion holds a tensor, both forms have the same global scales and
    feed the GEMMs the same bf16 weights (``decode`` without the global scale)."""
    gen = torch.Generator().manual_seed(2)
    packed, scale = spread_mxfp4((4, 16, 512), gen, span=18)
    block, glob_nv = nvfp4_ops.mxfp4_to_nvfp4(packed, scale)
    kernel_scale, glob = nvfp4_ops.mxfp4_kernel_scales(packed, scale)
    assert torch.equal(glob, glob_nv)
    assert torch.equal(fmt.decode(packed, kernel_scale), fmt.decode(packed, block))
    _check_exact(packed, scale, kernel_scale, glob)


def test_rebase_of_zero_blocks_and_rows():
    gen = torch.Generator().manual_seed(3)
    packed, scale = spread_mxfp4((2, 4, 256), gen)
    packed[0, 0, 16:32] &= 0x88  # block 1: +-0 codes only, any scale
    scale[0, 0, 1] = 0
    packed[1, 2] = 0  # a row of zeros
    scale[1, 2] = 0xFE
    kernel_scale, glob = fmt.mxfp4_kernel_scales(packed, scale.view(E8M0))
    _check_exact(packed, scale, kernel_scale, glob)
    assert kernel_scale.view(torch.uint8)[0, 0, 1] == 127  # zero blocks take 1.0
    assert glob[1, 2] == 1.0 and (kernel_scale.view(torch.uint8)[1, 2] == 127).all()


def test_rebase_chunks_give_the_same_answer(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    packed, scale = spread_mxfp4((5, 16, 256), gen, span=60)
    whole = fmt.mxfp4_kernel_scales(packed, scale)
    monkeypatch.setattr(fmt, "_CONVERT_CHUNK_BLOCKS", 24)
    chunked = fmt.mxfp4_kernel_scales(packed, scale)
    assert torch.equal(whole[0].view(torch.uint8), chunked[0].view(torch.uint8))
    assert torch.equal(whole[1], chunked[1])


def test_rebase_refuses_a_row_beyond_127_binades_and_nan():
    gen = torch.Generator().manual_seed(5)
    packed, scale = spread_mxfp4((2, 3, 256), gen, row_lo=120, row_hi=121, span=127)
    nvfp4_ops.mxfp4_kernel_scales(packed, scale)  # 127 binades: fine
    scale[1, 2, 3] = int(scale[1, 2].max()) - 127  # 128 binades in row (1, 2)
    packed[1, 2, 48:64] |= 0x01
    with pytest.raises(nvfp4_ops.NVFP4InputError) as info:
        nvfp4_ops.mxfp4_kernel_scales(packed, scale, name="layers.3.ffn.experts w2")
    msg = str(info.value)
    assert msg.startswith("layers.3.ffn.experts w2: nvfp4.mxfp4_kernel_scales")
    assert "row [1, 2]" in msg and "block 3" in msg and "127 binades" in msg
    packed[1, 2, 48:64] &= 0x88  # the block holds only zeros: no constraint
    _check_exact(packed, scale, *nvfp4_ops.mxfp4_kernel_scales(packed, scale))
    scale[0, 1, 2] = 0xFF
    with pytest.raises(nvfp4_ops.NVFP4InputError, match=r"scale\[0, 1, 2\] is 0xFF"):
        nvfp4_ops.mxfp4_kernel_scales(packed, scale)


def _group_exact(packed, scale, grouped, groups):
    kernel_scale, glob = grouped
    rows = packed.shape[-2]
    assert glob.dtype == torch.float32 and glob.shape == (*packed.shape[:-2], groups)
    b = kernel_scale.view(torch.uint8)
    assert int(b.min()) >= LO and int(b.max()) <= HI
    per_row = glob.repeat_interleave(rows // groups, dim=-1)
    got = fmt.dequantize(packed, kernel_scale, per_row)
    assert torch.equal(got, fmt.mxfp4_dequantize(packed, scale))


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_globals_exact(groups):
    """One global scale per group of rows (a MoE's expert halves): the row tops spread over
    100 binades, each row 18: the group's bytes drop by each row's distance, bitwise the same
    weights; chunked the same as whole."""
    gen = torch.Generator().manual_seed(11)
    packed, scale = spread_mxfp4((3, 16, 512), gen, row_lo=-50, row_hi=50, span=18)
    kernel_scale, glob = fmt.mxfp4_kernel_scales(packed, scale)
    grouped = fmt.mxfp4_group_globals(packed, kernel_scale, glob, groups)
    _group_exact(packed, scale, grouped, groups)
    # the group takes its largest row's global
    want = glob.view(3, groups, -1).amax(dim=-1)
    assert torch.equal(grouped[1], want)


def test_group_globals_chunks_zero_rows_and_refusal(monkeypatch):
    gen = torch.Generator().manual_seed(12)
    packed, scale = spread_mxfp4((2, 8, 256), gen, row_lo=-10, row_hi=10)
    packed[0, 1] = 0  # a row of zeros (global 1.0) does not set its group's global
    scale[0, 1] = 0xFE
    packed[1, 3, 16:32] &= 0x88  # a block of +-0 codes: byte 127, whatever its shift
    kernel_scale, glob = fmt.mxfp4_kernel_scales(packed, scale)
    whole = fmt.mxfp4_group_globals(packed, kernel_scale, glob, 2)
    _group_exact(packed, scale, whole, 2)
    assert whole[1][0, 0] == glob[0, [0, 2, 3]].max()
    assert whole[0].view(torch.uint8)[1, 3, 1] == 127
    monkeypatch.setattr(fmt, "_CONVERT_CHUNK_BLOCKS", 16)
    chunked = fmt.mxfp4_group_globals(packed, kernel_scale, glob, 2)
    assert torch.equal(whole[0].view(torch.uint8), chunked[0].view(torch.uint8))
    assert torch.equal(whole[1], chunked[1])
    packed[0] = 0  # a group of only zero rows: global 1.0
    scale[0] = 0x7F
    kernel_scale, glob = fmt.mxfp4_kernel_scales(packed, scale)
    zero = fmt.mxfp4_group_globals(packed, kernel_scale, glob, 1)
    _group_exact(packed, scale, zero, 1)
    assert zero[1][0, 0] == 1.0
    # rows whose tops lie 128 binades apart: a shared global would push the lower row's
    # blocks out of the window, so the per-row form stays
    packed, scale = spread_mxfp4((1, 2, 256), gen, row_lo=60, row_hi=61, span=10)
    scale[0, 1] -= 128
    kernel_scale, glob = fmt.mxfp4_kernel_scales(packed, scale)
    assert fmt.mxfp4_group_globals(packed, kernel_scale, glob, 1) is None
    with pytest.raises(ValueError, match="groups dividing R"):
        fmt.mxfp4_group_globals(packed, kernel_scale, glob, 3)


def test_rebase_op_fake_and_meta_errors():
    with FakeTensorMode():
        w = torch.empty(384, 6144, 3584, dtype=torch.uint8)  # V4-Pro w13, never allocated
        s = torch.empty(384, 6144, 224, dtype=E8M0)
        kernel_scale, glob = torch.ops.nvfp4.mxfp4_kernel_scales(w, s)
    assert kernel_scale.shape == (384, 6144, 224) and kernel_scale.dtype == E8M0
    assert glob.shape == (384, 6144) and glob.dtype == torch.float32
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="scale must have shape"):
        nvfp4_ops.mxfp4_kernel_scales(torch.zeros(4, 32, dtype=torch.uint8),
                                      torch.zeros(4, 3, dtype=torch.uint8))
    gen = torch.Generator().manual_seed(6)
    packed, scale = spread_mxfp4((2, 8, 128), gen)
    torch.library.opcheck(torch.ops.nvfp4.mxfp4_kernel_scales.default, (packed, scale),
                          test_utils=("test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_rebase_compiled_wrapper_matches_eager():
    gen = torch.Generator().manual_seed(11)
    packed, scale = spread_mxfp4((3, 16, 256), gen, span=40)
    torch._dynamo.reset()
    compiled = torch.compile(lambda w, s: nvfp4_ops.mxfp4_kernel_scales(w, s, name="w"),
                             fullgraph=True, dynamic=True)
    for rows in (16, 7):
        got = compiled(packed[:, :rows], scale[:, :rows])
        want = nvfp4_ops.mxfp4_kernel_scales(packed[:, :rows], scale[:, :rows])
        assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
        assert torch.equal(got[1], want[1])


# ---------------------------------------------------------------- nvfp4::moe on the form


def _experts(num_experts, hidden, inter, seed, span=18):
    gen = torch.Generator().manual_seed(seed)
    w13, s13 = spread_mxfp4((num_experts, 2 * inter, hidden), gen, -20, 2, span)
    w2, s2 = spread_mxfp4((num_experts, hidden, inter), gen, -20, 2, span)
    return w13, s13, w2, s2


def test_moe_on_kernel_scales_is_bitwise_the_converted_result():
    """The CPU op on the native form equals the op on the NVFP4 conversion bitwise (same
    weights, same order of sums), with EP ids outside the rank."""
    w13, s13, w2, s2 = _experts(4, 256, 128, 7)
    native = [*nvfp4_ops.mxfp4_kernel_scales(w13, s13), *nvfp4_ops.mxfp4_kernel_scales(w2, s2)]
    conv = [*nvfp4_ops.mxfp4_to_nvfp4(w13, s13), *nvfp4_ops.mxfp4_to_nvfp4(w2, s2)]
    hidden = torch.randn(9, 256).to(torch.bfloat16)
    ids, weights = random_routing(9, 8, 3, device="cpu")
    kw = dict(expert_start=2, global_num_experts=8, swiglu_limit=7.0, output_scale=1.5)
    got = nvfp4_ops.moe(hidden, ids, weights, w13, native[0], native[1], w2, native[2],
                        native[3], **kw)
    want = nvfp4_ops.moe(hidden, ids, weights, w13, conv[0], conv[1], w2, conv[2], conv[3],
                         **kw)
    assert torch.equal(got, want) and got.abs().max() > 0
    nvfp4_ops.check_moe_weights(w13, native[0], native[1], w2, native[2], native[3])


def _moe_args(num_experts=2, hidden=64, inter=32, tokens=3):
    w13 = torch.zeros(num_experts, 2 * inter, hidden // 2, dtype=torch.uint8)
    w2 = torch.zeros(num_experts, hidden, inter // 2, dtype=torch.uint8)
    s13 = torch.full((num_experts, 2 * inter, hidden // 32), 127, dtype=torch.uint8).view(E8M0)
    s2 = torch.full((num_experts, hidden, inter // 32), 127, dtype=torch.uint8).view(E8M0)
    g13 = torch.ones(num_experts, 2 * inter)
    g2 = torch.ones(num_experts, hidden)
    x = torch.zeros(tokens, hidden, dtype=torch.bfloat16)
    ids = torch.zeros(tokens, 2, dtype=torch.int32)
    wts = torch.ones(tokens, 2)
    return dict(hidden=x, topk_ids=ids, topk_weights=wts, w13=w13, w13_scale=s13,
                w13_global=g13, w2=w2, w2_scale=s2, w2_global=g2)


def _call(a):
    return nvfp4_ops.moe(a["hidden"], a["topk_ids"], a["topk_weights"], a["w13"],
                         a["w13_scale"], a["w13_global"], a["w2"], a["w2_scale"],
                         a["w2_global"])


def test_moe_fake_takes_the_form_without_data():
    a = _moe_args()
    with FakeTensorMode() as mode:
        out = _call({k: mode.from_tensor(v) for k, v in a.items()})
    assert out.shape == (3, 64) and out.dtype == torch.bfloat16
    meta = {k: v.to("meta") for k, v in a.items()}
    assert _call(meta).device.type == "meta"


def test_mlp_refuses_mx_scales():
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    w13 = torch.zeros(64, 32, dtype=torch.uint8)
    s13 = torch.full((64, 2), 127, dtype=torch.uint8).view(E8M0)
    w2 = torch.zeros(64, 16, dtype=torch.uint8)
    s2 = torch.full((64, 1), 127, dtype=torch.uint8).view(E8M0)
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="w13_scale must be float8_e4m3fn"):
        nvfp4_ops.mlp(x, w13, s13, torch.ones(2), w2, s2, torch.ones(()))


# ---------------------------------------------------------------- dispatch


@pytest.mark.parametrize("shape_name", ["v4-flash", "v4-pro"])
def test_mx_plans_are_the_nvfp4_plans_with_mx_scales(shape_name):
    s = nvfp4_ops.get_shape(shape_name)
    assert dispatch.moe_mx_supported(s.hidden, s.intermediate)
    wp = dispatch.WeightOrder.WPERM
    for t in (1, 8, 100, 512, 2048, 4096, 16384):
        for e in (s.experts, s.experts // 8):
            kw = dict(global_num_experts=s.experts, order=wp)
            nv = dispatch.plan_moe(t, s.top_k, e, s.hidden, s.intermediate, **kw)
            mx = dispatch.plan_moe(t, s.top_k, e, s.hidden, s.intermediate, mx=True, **kw)
            assert mx.num_rows == nv.num_rows and mx.block_m == nv.block_m
            pairs = [(nv.gate_up, mx.gate_up), (nv.down, mx.down)]
            if nv.hot is not None:
                pairs += [(nv.hot.gate_up, mx.hot.gate_up), (nv.hot.down, mx.hot.down)]
            for a, b in pairs:
                assert b.config.mx and not a.config.mx and b.act_order == a.act_order
                # the same config with mx scales, but MXFP4's persistent streamed tile keeps
                # per-row bulk copies (dispatch._tma2d)
                fields = {"mx": True}
                if getattr(a.config, "tma2d", False) and a.config.ctas:
                    fields["tma2d"] = False
                assert b.config == dataclasses.replace(a.config, **fields)


def test_mx_needs_512_k_stages_and_permuted_kernels():
    assert not dispatch.moe_mx_supported(4096, 2048 + 128)  # I % 512
    assert dispatch.moe_supported(4096, 2048 + 128)
    with pytest.raises(ValueError, match="moe_mx_supported"):
        dispatch.plan_moe(8, 6, 16, 4096, 2048 + 128, mx=True)
    with pytest.raises(ValueError, match="permuted activations only"):
        dispatch.plan_gemm(4096, 4096, 8, epilogue="swiglu", grouped=True, mx=True)
    # the down GEMM's streamed tile keeps its 512-k chunk; no 256-k fallback for mx
    plan = dispatch.plan_gemm(4096, 2048, 8, epilogue="row_scale", grouped=True,
                              permuted=True, mx=True)
    assert plan.config.kc >= 512 and plan.config.s_stride >= plan.config.kc // 32
    with pytest.raises(ValueError, match="K % 512"):
        dispatch.plan_gemm(4096, 1280, 8, epilogue="row_scale", grouped=True, permuted=True,
                           mx=True)


# ---------------------------------------------------------------- preparation and its switch


def test_prepare_native_and_the_switch(monkeypatch):
    w13, s13, w2, s2 = _experts(2, 256, 128, 8)
    s13_in, s2_in = s13.clone(), s2.clone()
    out = nvfp4_ops.prepare_mxfp4_moe(w13, s13, w2, s2, native=True)
    assert out[0].dtype == E8M0 and out[0].shape == s13.shape and out[4] is False
    assert out[1].shape == (2, 2) and out[3].shape == (2,)  # one global per expert half
    assert torch.equal(s13, s13_in) and torch.equal(s2, s2_in)  # the inputs are not modified
    monkeypatch.setenv("NVFP4_OPS_MXFP4_SCALES", " Native ")
    assert nvfp4_ops.prepare_mxfp4_moe(w13, s13, w2, s2)[2].dtype == E8M0
    monkeypatch.setenv("NVFP4_OPS_MXFP4_SCALES", "convert")
    assert nvfp4_ops.prepare_mxfp4_moe(w13, s13, w2, s2)[0].dtype == torch.float8_e4m3fn
    for auto in ("", "AUTO"):  # auto (the default) converts CPU tensors
        monkeypatch.setenv("NVFP4_OPS_MXFP4_SCALES", auto)
        assert nvfp4_ops.prepare_mxfp4_moe(w13, s13, w2, s2)[0].dtype == torch.float8_e4m3fn
    monkeypatch.setenv("NVFP4_OPS_MXFP4_SCALES", "ue8m0")
    with pytest.raises(nvfp4_ops.NVFP4EnvError, match="NVFP4_OPS_MXFP4_SCALES must be"):
        nvfp4_ops.prepare_mxfp4_moe(w13, s13, w2, s2)


def test_prepare_native_groups_each_tensor_where_it_fits():
    """``prepare_mxfp4_moe(native=True)`` gives one global scale per expert half where the
    window holds each half, and keeps one per row for a tensor where it does not (here w13:
    one up row's top is 2^127, at least 125 binades above the rest of its half, whose rows
    each span 10), each tensor on its own; the op's output is bitwise the same for either
    form."""
    w13, s13, w2, s2 = _experts(2, 256, 128, 21, span=10)
    row = s13[1, 200].int()
    s13[1, 200] = (row - row.max() + 254).to(torch.uint8)  # expert 1, an up row
    n13, g13, n2, g2, _ = nvfp4_ops.prepare_mxfp4_moe(w13, s13, w2, s2, native=True)
    assert g13.shape == (2, 256) and g2.shape == (2,)
    _check_exact(w13, s13, n13, g13)
    _group_exact(w2, s2, (n2, g2.unsqueeze(-1)), 1)
    hidden = torch.randn(5, 256).to(torch.bfloat16)
    ids, weights = random_routing(5, 2, 2, device="cpu")
    row_form = [*nvfp4_ops.mxfp4_kernel_scales(w2, s2)]
    got = nvfp4_ops.moe(hidden, ids, weights, w13, n13, g13, w2, n2, g2, swiglu_limit=7.0)
    want = nvfp4_ops.moe(hidden, ids, weights, w13, n13, g13, w2, *row_form, swiglu_limit=7.0)
    assert torch.equal(got, want)


def test_keeps_mxfp4_scales_is_the_one_rule(monkeypatch):
    """auto (the default): native on CUDA at the sizes the ``mx`` kernels read, converted on the
    CPU and at other sizes; the switch and an explicit ``native`` override it."""
    from nvfp4_ops.prepare import keeps_mxfp4_scales

    monkeypatch.delenv("NVFP4_OPS_MXFP4_SCALES", raising=False)
    assert keeps_mxfp4_scales(4096, 2048, cuda=True)
    assert not keeps_mxfp4_scales(4096, 2048, cuda=False)
    assert not keeps_mxfp4_scales(256, 128, cuda=True)  # I % 512: no mx kernels
    assert not keeps_mxfp4_scales(4096, 2048, cuda=True, native=False)
    monkeypatch.setenv("NVFP4_OPS_MXFP4_SCALES", "native")
    assert keeps_mxfp4_scales(256, 128, cuda=False)
    monkeypatch.setenv("NVFP4_OPS_MXFP4_SCALES", "convert")
    assert not keeps_mxfp4_scales(4096, 2048, cuda=True)
    assert keeps_mxfp4_scales(4096, 2048, cuda=True, native=True)


def test_warmup_layers_follow_the_switch(monkeypatch):
    from nvfp4_ops import _warmup

    monkeypatch.setenv("NVFP4_OPS_MXFP4_SCALES", "convert")
    assert not any(getattr(x, "mx", False) for x in _warmup.layers_for_shapes(["v4-flash"]))
    for value in ("native", "auto", ""):  # the MXFP4 variants unless scales are converted
        monkeypatch.setenv("NVFP4_OPS_MXFP4_SCALES", value)
        layers = _warmup.layers_for_shapes(["v4-flash"])
        assert [x.wperm for x in layers if isinstance(x, nvfp4_ops.MoELayer) and x.mx] == [True]
    names = {p.config.name for p in _warmup.plans_for(layers)}
    s = nvfp4_ops.get_shape("v4-flash")
    for t in (1, 8, 512, 4096):
        plan = dispatch.plan_moe(t, 6, s.experts, s.hidden, s.intermediate,
                                 order=dispatch.WeightOrder.WPERM, mx=True)
        assert {plan.gate_up.config.name, plan.down.config.name} <= names


def test_warmup_launches_pass_the_checked_form(monkeypatch):
    """Warm-up's one launch of each MXFP4 variant (``linear_cuda.run_once``) builds UE8M0
    scales ``[1, N, K/32]`` that the checked launcher accepts; an e4m3-shaped scale tensor is
    refused for an ``mx`` plan (the binary is a recorder here: nothing runs)."""
    from nvfp4_ops import _warmup
    from nvfp4_ops.kernels import linear_cuda

    calls = []
    monkeypatch.setattr(linear_cuda, "compiled", lambda cfg: lambda *a: calls.append((cfg, a)))
    s = nvfp4_ops.get_shape("v4-flash")
    plans = _warmup.plans_for([nvfp4_ops.MoELayer(s.experts, s.hidden, s.intermediate,
                                                  s.top_k, wperm=True, mx=True)])
    for plan in plans:
        linear_cuda.run_once(plan, device="cpu")
        cfg, args = calls[-1]
        assert cfg is plan.config and args[2].shape == (1, cfg.n, cfg.k // 32)
        assert (args[2] == 127).all()  # 1.0, inside the kernels' window
    plan = plans[0]
    cfg = plan.config
    rows = cfg.block_m
    with pytest.raises(ValueError, match="shape mismatch"):
        linear_cuda.run_gemm(
            plan, torch.zeros(rows, cfg.k, dtype=torch.bfloat16),
            torch.zeros(1, cfg.n, cfg.k // 2, dtype=torch.uint8),
            torch.zeros(1, cfg.n, cfg.k // 16, dtype=torch.uint8), torch.ones(1, cfg.n),
            torch.empty(rows, cfg.n_out, dtype=torch.bfloat16),
            tile_expert=torch.zeros(1, dtype=torch.int32))


def test_cuda_path_refuses_mx_scales_its_kernels_cannot_read():
    """Sizes the grouped kernels cover, but not with MXFP4 scales (I % 512): the CUDA
    implementation refuses before planning, naming the sizes and the way out."""
    pytest.importorskip("cutlass")
    from nvfp4_ops.kernels import moe_cuda

    a = _moe_args(hidden=256, inter=128)
    with pytest.raises(nvfp4_ops.NVFP4InputError,
                       match=r"MXFP4 scales \(float8_e8m0fnu\) at H=256, I=128 .*"
                             r"moe_mx_supported.*nvfp4_ops\.mxfp4_to_nvfp4"):
        moe_cuda.moe_cuda(*a.values(), 0, None, 1.0)


def test_moe_opcheck_with_mx_scales():
    """opcheck of ``nvfp4::moe`` on the kernels' MXFP4 form (``test_schema`` cannot compare
    float8 inputs on the CPU, and uint8 scale bytes mean e4m3 to the op: the other utils)."""
    w13, s13, w2, s2 = _experts(2, 64, 32, 12)
    k13, g13 = nvfp4_ops.mxfp4_kernel_scales(w13, s13)
    k2, g2 = nvfp4_ops.mxfp4_kernel_scales(w2, s2)
    hidden = torch.randn(3, 64).to(torch.bfloat16)
    ids, weights = random_routing(3, 2, 2, device="cpu")
    torch.library.opcheck(
        torch.ops.nvfp4.moe.default,
        (hidden, ids, weights, w13, k13, g13, w2, k2, g2, 0, 2, 7.0, 1.0),
        test_utils=("test_autograd_registration", "test_faketensor",
                    "test_aot_dispatch_dynamic"))


# ---------------------------------------------------------------- the decoders' scale factor


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX ``prmt.b32`` (default mode): result byte i = byte ``sel >> 4i & 7`` of ``b:a``."""
    pool = (a | b << 32).to_bytes(8, "little")
    out = 0
    for i in range(4):
        nib = sel >> (4 * i) & 0xF
        assert nib < 8, "sign-replicate selectors are not used"
        out |= pool[nib] << (8 * i)
    return out


def _bf16_bits(values: torch.Tensor) -> list[int]:
    return values.to(torch.bfloat16).view(torch.int16).int().bitwise_and(0xFFFF).tolist()


def test_mx_scale_factors_are_the_e4m3_paths_prescale():
    """The integer steps of ``fp4_ptx.mx_scale_pre`` (one ``mad``) and ``mx_pair_pre`` (``prmt``
    then ``mad``), emulated bit for bit: every UE8M0 byte of the kernels' window gives the bf16
    ``2^(b - 127) * 2^119`` in both halves (the factor the e4m3 path multiplies by), the pair
    form the lo row's in the low half and the hi row's in the high half, for both chunks."""
    pytest.importorskip("cutlass")
    from nvfp4_ops.kernels.cute import fp4_ptx

    window = torch.arange(LO, HI + 1)
    want = _bf16_bits(torch.exp2((window - 127 + 119).double()))
    bias = fp4_ptx._MX_BIAS
    for b, w in zip(window.tolist(), want, strict=True):
        got = (b * 0x00800080 + bias) & 0xFFFFFFFF  # mx_scale_pre
        assert got == w | w << 16, (b, hex(got), hex(w))
    for j in (0, 1):
        sel = fp4_ptx.mx_pair_selector(j)
        for b_lo, b_hi in ((LO, HI), (127, 9), (135, 128), (100, 117)):
            lo = (b_lo << 8 * j) | (0x55 << 8 * (1 - j))  # the other chunk's byte: 0x55
            hi = (b_hi << 8 * j) | (0x66 << 8 * (1 - j))
            got = (_prmt(lo, hi, sel) * 128 + bias) & 0xFFFFFFFF  # mx_pair_pre
            w_lo, w_hi = _bf16_bits(torch.exp2(torch.tensor([b_lo - 8.0, b_hi - 8.0])))
            assert got == w_lo | w_hi << 16, (j, b_lo, b_hi, hex(got))
    # the smallest code (0.5 = 2^-127 as decoded, a bf16 subnormal) times the smallest factor
    # is a normal bf16; the largest factor stays finite
    assert 2.0 ** -127 * 2.0 ** (LO - 8) == torch.finfo(torch.bfloat16).tiny
    assert HI + 119 <= 254
