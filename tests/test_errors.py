"""Bad input gets a clear NVFP4InputError naming the argument, what was expected and what was
seen — eagerly, and at trace time under torch.compile (the fakes run the same checks)."""

from __future__ import annotations

import math

import pytest
import torch

import nvfp4_ops
from nvfp4_ops import NVFP4InputError
from nvfp4_ops.testing import random_experts, random_nvfp4

H, INTER, E, K = 64, 32, 4, 2


@pytest.fixture(scope="module")
def lin():
    torch.manual_seed(0)
    p, s, g = random_nvfp4(48, 64)
    return dict(x=torch.randn(3, 64).to(torch.bfloat16), weight=p, weight_scale=s,
                global_scale=g, bias=None)


@pytest.fixture(scope="module")
def moe_args():
    torch.manual_seed(1)
    ex = random_experts(E, H, INTER)
    return dict(hidden=torch.randn(5, H).to(torch.bfloat16),
                topk_ids=torch.randint(0, E, (5, K), dtype=torch.int32),
                topk_weights=torch.rand(5, K), w13=ex.w13, w13_scale=ex.w13_scale,
                w13_global=ex.w13_global, w2=ex.w2, w2_scale=ex.w2_scale,
                w2_global=ex.w2_global)


def _linear(a):
    return nvfp4_ops.linear(a["x"], a["weight"], a["weight_scale"], a["global_scale"],
                            a["bias"])


def _moe(a, **kw):
    return nvfp4_ops.moe(*a.values(), **kw)


def _mlp(a, **over):
    args = dict(x=a["hidden"], w13=a["w13"][0], w13_scale=a["w13_scale"][0],
                w13_global=a["w13_global"][0], w2=a["w2"][0], w2_scale=a["w2_scale"][0],
                w2_global=a["w2_global"][0])
    args.update(over)
    return nvfp4_ops.mlp(*args.values(), swiglu_limit=10.0)


LINEAR_CASES = {
    "x dtype": (lambda a: {**a, "x": a["x"].float()}, r"x must be bfloat16, got float32"),
    "x rank": (lambda a: {**a, "x": a["x"][None]}, r"x must be 2-D \[M, K\], got shape \(1, 3, 64\)"),
    "K alignment": (lambda a: {**a, "x": a["x"][:, :48].contiguous()},
                    r"K \(x.shape\[1\]\) = 48 must be a positive multiple of 32"),
    "weight dtype": (lambda a: {**a, "weight": a["weight"].to(torch.int8)},
                     r"weight must be uint8, got int8"),
    "weight shape": (lambda a: {**a, "weight": a["weight"][:, :16].contiguous()},
                     r"weight must have shape \[N, K/2\] = \(48, 32\), got \(48, 16\)"),
    "scale dtype": (lambda a: {**a, "weight_scale": a["weight_scale"].float()},
                    r"weight_scale must be float8_e4m3fn or uint8, got float32"),
    "scale shape": (lambda a: {**a, "weight_scale": a["weight_scale"][:40]},
                    r"weight_scale must have shape \[N, K/16\] = \(48, 4\), got \(40, 4\)"),
    "global dtype": (lambda a: {**a, "global_scale": a["global_scale"].double()},
                     r"global_scale must be float32, got float64"),
    "global shape": (lambda a: {**a, "global_scale": torch.ones(7)},
                     r"global_scale must have shape \[\] or \[N\] = \(48,\), got \(7,\)"),
    "global zero": (lambda a: {**a, "global_scale": torch.tensor(0.0)},
                    r"global_scale must be finite and > 0, got 0.0"),
    "global nan": (lambda a: {**a, "global_scale": torch.full((48,), math.nan)},
                   r"global_scale must be finite and > 0, got nan at index \(0,\)"),
    "global negative": (lambda a: {**a, "global_scale": -torch.ones(48)},
                        r"global_scale must be finite and > 0, got -1.0"),
    "bias shape": (lambda a: {**a, "bias": torch.zeros(5, dtype=torch.bfloat16)},
                   r"bias must have shape \[N\] = \(48,\), got \(5,\)"),
    "non-contiguous": (lambda a: {**a, "x": torch.randn(64, 3).to(torch.bfloat16).T},
                       r"x must be contiguous"),
    "device": (lambda a: {**a, "global_scale": torch.empty((), device="meta")},
               r"all tensors must be on one device; x is on cpu but global_scale is on meta"),
}


@pytest.mark.parametrize("case", list(LINEAR_CASES))
def test_linear_errors(lin, case):
    change, message = LINEAR_CASES[case]
    with pytest.raises(NVFP4InputError, match=message):
        _linear(change(lin))


MOE_CASES = {
    "ids too large": (lambda a: {**a, "topk_ids": torch.full((5, K), 9, dtype=torch.int32)},
                      dict(global_num_experts=8),
                      r"topk_ids must be global expert ids in \[0, 8\), got min 9, max 9"),
    "ids negative": (lambda a: {**a, "topk_ids": -torch.ones(5, K, dtype=torch.int64)}, {},
                     r"topk_ids must be global expert ids in >= 0, got min -1"),
    "ids dtype": (lambda a: {**a, "topk_ids": a["topk_ids"].float()}, {},
                  r"topk_ids must be int32 or int64, got float32"),
    "ids rows": (lambda a: {**a, "topk_ids": a["topk_ids"][:4]}, {},
                 r"topk_ids must be \[T, k\] with T = hidden.shape\[0\] = 5, got shape \(4, 2\)"),
    "weights shape": (lambda a: {**a, "topk_weights": a["topk_weights"][:, :1].contiguous()}, {},
                      r"topk_weights must have shape \[T, k\] \(as topk_ids\) = \(5, 2\), got \(5, 1\)"),
    "weights dtype": (lambda a: {**a, "topk_weights": a["topk_weights"].bfloat16()}, {},
                      r"topk_weights must be float32, got bfloat16"),
    "hidden dtype": (lambda a: {**a, "hidden": a["hidden"].half()}, {},
                     r"hidden must be bfloat16, got float16"),
    "w13 odd rows": (lambda a: {**a, "w13": a["w13"][:, :-1].contiguous()}, {},
                     r"w13 must be uint8 \[E, 2I, H/2\] \(gate rows then up rows\), got shape \(4, 63, 32\)"),
    "w13_global shape": (lambda a: {**a, "w13_global": a["w13_global"][:, 0].contiguous()}, {},
                         r"w13_global must have shape \[E, 2\] \(gate, up\) or \[E, 2I\] \(per row\) = \(4, 2\), got \(4,\)"),
    "w2 shape": (lambda a: {**a, "w2": a["w2"].transpose(1, 2).contiguous()}, {},
                 r"w2 must have shape \[E, H, I/2\] = \(4, 64, 16\), got \(4, 16, 64\)"),
    "w2_scale experts": (lambda a: {**a, "w2_scale": a["w2_scale"][:3]}, {},
                         r"w2_scale must have shape \[E, H, I/16\] = \(4, 64, 2\), got \(3, 64, 2\)"),
    "w2_global zero": (lambda a: {**a, "w2_global": torch.zeros(E)}, {},
                       r"w2_global must be finite and > 0, got 0.0 at index \(0,\) \(4 bad of 4\)"),
    "w13_global inf": (lambda a: {**a, "w13_global": a["w13_global"].clone().index_fill_(
        0, torch.tensor([2]), math.inf)}, {},
        r"w13_global must be finite and > 0, got inf at index \(2, 0\)"),
    "expert_start": (lambda a: a, dict(expert_start=-1), r"expert_start must be >= 0, got -1"),
    "start past global": (lambda a: a, dict(expert_start=6, global_num_experts=8),
                          r"expert_start \+ E = 6 \+ 4 exceeds global_num_experts = 8"),
}


@pytest.mark.parametrize("case", list(MOE_CASES))
def test_moe_errors(moe_args, case):
    change, kwargs, message = MOE_CASES[case]
    with pytest.raises(NVFP4InputError, match=message):
        _moe(change(moe_args), **kwargs)


def test_mlp_errors(moe_args):
    with pytest.raises(NVFP4InputError, match=r"w13_global must have shape \[2\] \(gate, up\) or \[2I\] \(per row\)"):
        _mlp(moe_args, w13_global=torch.ones(1))
    with pytest.raises(NVFP4InputError, match=r"w2 must have shape \[H, I/2\] = \(64, 16\)"):
        _mlp(moe_args, w2=moe_args["w2"][1, :32])
    with pytest.raises(NVFP4InputError, match=r"w2_global must be finite and > 0"):
        _mlp(moe_args, w2_global=torch.tensor(math.nan))


def test_quantize_dequantize_errors():
    with pytest.raises(NVFP4InputError, match=r"x must be \[..., K\] with K % 16 == 0"):
        nvfp4_ops.quantize(torch.randn(2, 24))
    with pytest.raises(NVFP4InputError, match=r"x must be bfloat16 or float16 or float32"):
        nvfp4_ops.quantize(torch.ones(2, 32, dtype=torch.int32))
    with pytest.raises(NVFP4InputError, match=r"NaN or Inf"):
        nvfp4_ops.quantize(torch.full((1, 16), math.inf))
    p, s, g = nvfp4_ops.quantize(torch.randn(4, 32))
    with pytest.raises(NVFP4InputError, match=r"block_scale must have shape \[..., K/16\]"):
        nvfp4_ops.dequantize(p, s[:, :1], g)


def test_errors_surface_at_compile_time(lin):
    """Under torch.compile the fake runs the same shape checks while tracing."""
    bad = {**lin, "weight": lin["weight"][:, :16].contiguous()}
    fn = torch.compile(lambda x: nvfp4_ops.linear(x, bad["weight"], bad["weight_scale"],
                                                  bad["global_scale"]), fullgraph=True)
    with pytest.raises(Exception, match=r"weight must have shape \[N, K/2\]"):
        fn(lin["x"])


def test_verified_global_scale_rechecked_after_in_place_change(lin):
    """Scales that passed are cached (no device read per call) until modified in place."""
    g = lin["global_scale"].clone()
    args = {**lin, "global_scale": g}
    _linear(args)  # passes, and marks g verified
    g.zero_()  # bumps the version counter: the next call must look again
    with pytest.raises(NVFP4InputError, match=r"global_scale must be finite and > 0, got 0.0"):
        _linear(args)


def test_inference_mode_tensors_are_checked_every_call(lin, moe_args):
    """Inference tensors have no version counter: never cached, always checked, no crash."""
    with torch.inference_mode():
        g = lin["global_scale"].clone()
        args = {**lin, "global_scale": g}
        _linear(args)
        g.fill_(math.nan)
        with pytest.raises(NVFP4InputError, match=r"global_scale must be finite and > 0"):
            _linear(args)
        moe = {**moe_args, "w13_global": moe_args["w13_global"].clone(),
               "w2_global": moe_args["w2_global"].clone()}
        assert torch.isfinite(_moe(moe).float()).all()
        moe["w2_global"][1] = 0.0
        with pytest.raises(NVFP4InputError, match=r"w2_global must be finite and > 0"):
            _moe(moe)
