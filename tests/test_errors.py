"""Bad input gets a clear NVFP4InputError naming the argument, what was expected and what was
seen — eagerly, and at trace time under torch.compile (the fakes run the same checks).

Per call the ops check metadata and Python scalars; weight values are checked once by
``nvfp4_ops.check_*_weights``; per-call device data only with ``NVFP4_OPS_VALUE_CHECKS=1``.
One case per error message."""

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
    "expert_start": (lambda a: a, dict(expert_start=-1), r"expert_start must be >= 0, got -1"),
    "start past global": (lambda a: a, dict(expert_start=6, global_num_experts=8),
                          r"expert_start \+ E = 6 \+ 4 exceeds global_num_experts = 8"),
    "global experts 0": (lambda a: a, dict(global_num_experts=0),
                         r"global_num_experts must be > 0 \(the experts over all ranks\) or -1 \(unknown\), got 0"),
    "global experts -5": (lambda a: a, dict(global_num_experts=-5),
                          r"global_num_experts must be > 0 .* or -1 \(unknown\), got -5"),
    "swiglu_limit nan": (lambda a: a, dict(swiglu_limit=math.nan),
                         r"swiglu_limit must be > 0 \(or None / inf for no clamp\), got nan"),
    "swiglu_limit negative": (lambda a: a, dict(swiglu_limit=-1.0),
                              r"swiglu_limit must be > 0 \(or None / inf for no clamp\), got -1.0"),
    "swiglu_limit zero": (lambda a: a, dict(swiglu_limit=0.0),
                          r"swiglu_limit must be > 0 \(or None / inf for no clamp\), got 0.0"),
    "swiglu_limit -inf": (lambda a: a, dict(swiglu_limit=-math.inf),
                          r"swiglu_limit must be > 0 \(or None / inf for no clamp\), got -inf"),
    "output_scale nan": (lambda a: a, dict(output_scale=math.nan),
                         r"output_scale must be finite, got nan"),
    "output_scale inf": (lambda a: a, dict(output_scale=math.inf),
                         r"output_scale must be finite, got inf"),
    "output_scale -inf": (lambda a: a, dict(output_scale=-math.inf),
                          r"output_scale must be finite, got -inf"),
    # MXFP4 scales in the kernels' form (float8_e8m0fnu, one per 32 k)
    "scale kinds mixed": (lambda a: {**a, "w2_scale": _e8m0(E, H, INTER // 32)}, {},
                          r"w13_scale and w2_scale must both be e4m3 block scales \(NVFP4: "
                          r"float8_e4m3fn or uint8\) or both float8_e8m0fnu \(MXFP4\), got "
                          r"float8_e4m3fn and float8_e8m0fnu"),
    "mx scale shape": (lambda a: {**a, "w13_scale": _e8m0(E, 2 * INTER, H // 16),
                                  "w2_scale": _e8m0(E, H, INTER // 32)}, {},
                       r"w13_scale must have shape \[E, 2I, H/32\] = \(4, 64, 2\), got "
                       r"\(4, 64, 4\)"),
}


def _e8m0(*shape):
    return torch.full(shape, 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)


@pytest.mark.parametrize("case", list(MOE_CASES))
def test_moe_errors(moe_args, case):
    change, kwargs, message = MOE_CASES[case]
    with pytest.raises(NVFP4InputError, match=message):
        _moe(change(moe_args), **kwargs)


@pytest.mark.parametrize("case", list(MOE_CASES))
def test_moe_errors_in_the_fake(moe_args, case):
    """The same message from the fake, on meta tensors (what torch.compile and export trace)."""
    change, kwargs, message = MOE_CASES[case]
    meta = {n: t.to("meta") for n, t in change(moe_args).items()}
    with pytest.raises(NVFP4InputError, match=message):
        _moe(meta, **kwargs)


MLP_CASES = {
    "w13_global shape": (dict(w13_global=torch.ones(1)), {},
                         r"w13_global must have shape \[2\] \(gate, up\)"),
    "w2 shape": (dict(w2="w2[1, :32]"), {}, r"w2 must have shape \[H, I/2\] = \(64, 16\)"),
    "swiglu_limit nan": ({}, dict(swiglu_limit=math.nan),
                         r"nvfp4.mlp: swiglu_limit must be > 0 \(or None / inf for no clamp\), got nan"),
    "swiglu_limit negative": ({}, dict(swiglu_limit=-2.0),
                              r"nvfp4.mlp: swiglu_limit must be > 0 .*, got -2.0"),
    "swiglu_limit zero": ({}, dict(swiglu_limit=0.0),
                          r"nvfp4.mlp: swiglu_limit must be > 0 .*, got 0.0"),
}


@pytest.mark.parametrize("meta", [False, True], ids=["op", "fake"])
@pytest.mark.parametrize("case", list(MLP_CASES))
def test_mlp_errors(moe_args, case, meta):
    over, kwargs, message = MLP_CASES[case]
    over = {n: moe_args["w2"][1, :32] if v == "w2[1, :32]" else v for n, v in over.items()}
    args = dict(x=moe_args["hidden"], w13=moe_args["w13"][0], w13_scale=moe_args["w13_scale"][0],
                w13_global=moe_args["w13_global"][0], w2=moe_args["w2"][0],
                w2_scale=moe_args["w2_scale"][0], w2_global=moe_args["w2_global"][0])
    args.update(over)
    if meta:
        args = {n: t.to("meta") for n, t in args.items()}
    with pytest.raises(NVFP4InputError, match=message):
        nvfp4_ops.mlp(*args.values(), swiglu_limit=kwargs.get("swiglu_limit", 10.0))


# --- weight values: checked once, by check_linear_weights / check_mlp_weights / check_moe_weights


def _e4m3_byte(t: torch.Tensor, index: tuple, byte: int) -> torch.Tensor:
    """A copy of block scales ``t`` with the byte at ``index`` replaced."""
    out = t.clone()
    out.view(torch.uint8)[index] = byte
    return out


LINEAR_WEIGHT_CASES = {
    "global zero": (lambda a: {**a, "global_scale": torch.tensor(0.0)},
                    r"global_scale must be finite and > 0, got 0.0 \(1 bad of 1\)"),
    "global nan": (lambda a: {**a, "global_scale": torch.full((48,), math.nan)},
                   r"global_scale must be finite and > 0, got nan at index \(0,\) \(48 bad of 48\)"),
    "global negative": (lambda a: {**a, "global_scale": -torch.ones(48)},
                        r"global_scale must be finite and > 0, got -1.0 at index \(0,\)"),
    "global inf": (lambda a: {**a, "global_scale": torch.ones(48).index_fill_(0, torch.tensor([7]), math.inf)},
                   r"global_scale must be finite and > 0, got inf at index \(7,\) \(1 bad of 48\)"),
    "block scale nan": (lambda a: {**a, "weight_scale": _e4m3_byte(a["weight_scale"], (5, 2), 0x7F)},
                        r"weight_scale must hold e4m3 block scales >= 0 \(no NaN\), got NaN \(byte 0x7f\) at index \(5, 2\) \(1 bad of 192\)"),
    "block scale negative nan": (lambda a: {**a, "weight_scale": _e4m3_byte(a["weight_scale"], (0, 0), 0xFF)},
                                 r"weight_scale must hold e4m3 block scales >= 0 \(no NaN\), got NaN \(byte 0xff\) at index \(0, 0\)"),
    "block scale negative": (lambda a: {**a, "weight_scale": _e4m3_byte(a["weight_scale"], (47, 3), 0xB8)},
                             r"weight_scale must hold e4m3 block scales >= 0 \(no NaN\), got -1 \(byte 0xb8\) at index \(47, 3\)"),
    "weight shape": (lambda a: {**a, "weight_scale": a["weight_scale"][:, :2].contiguous()},
                     r"weight_scale must have shape \[N, K/16\] = \(48, 4\), got \(48, 2\)"),
    "weight rank": (lambda a: {**a, "weight": a["weight"][None]},
                    r"weight must be 2-D uint8 \[N, K/2\], got \(1, 48, 32\)"),
    "K alignment": (lambda a: {**a, "weight": a["weight"][:, :8].contiguous(),
                               "weight_scale": a["weight_scale"][:, :1].contiguous()},
                    r"K \(weight.shape\[1\] \* 2\) = 16 must be a positive multiple of 32"),
    "device": (lambda a: {**a, "global_scale": torch.empty((), device="meta")},
               r"all tensors must be on one device; weight is on cpu but global_scale is on meta"),
    "non-contiguous": (lambda a: {**a, "weight_scale": a["weight_scale"].T.contiguous().T},
                       r"weight_scale must be contiguous"),
}


@pytest.mark.parametrize("case", list(LINEAR_WEIGHT_CASES))
def test_check_linear_weights_errors(lin, case):
    a = LINEAR_WEIGHT_CASES[case][0](lin)
    with pytest.raises(NVFP4InputError, match=LINEAR_WEIGHT_CASES[case][1]):
        nvfp4_ops.check_linear_weights(a["weight"], a["weight_scale"], a["global_scale"],
                                       a["bias"], where="layer.3.qkv")
    with pytest.raises(NVFP4InputError, match=r"^layer\.3\.qkv: "):
        nvfp4_ops.check_linear_weights(a["weight"], a["weight_scale"], a["global_scale"],
                                       a["bias"], where="layer.3.qkv")


def _weights(a, **over):
    w = {n: a[n] for n in ("w13", "w13_scale", "w13_global", "w2", "w2_scale", "w2_global")}
    w.update(over)
    return w


MOE_WEIGHT_CASES = {
    "w2_global zero": (lambda a: _weights(a, w2_global=torch.zeros(E)),
                       r"w2_global must be finite and > 0, got 0.0 at index \(0,\) \(4 bad of 4\)"),
    "w13_global inf": (lambda a: _weights(a, w13_global=a["w13_global"].clone().index_fill_(
        0, torch.tensor([2]), math.inf)),
        r"w13_global must be finite and > 0, got inf at index \(2, 0\) \(2 bad of 8\)"),
    "w13_global per row nan": (lambda a: _weights(a, w13_global=torch.ones(E, 2 * INTER).index_fill_(
        1, torch.tensor([33]), math.nan)),
        r"w13_global must be finite and > 0, got nan at index \(0, 33\) \(4 bad of 256\)"),
    "w2_global per row negative": (lambda a: _weights(a, w2_global=torch.ones(E, H).index_fill_(
        1, torch.tensor([63]), -2.0)),
        r"w2_global must be finite and > 0, got -2.0 at index \(0, 63\) \(4 bad of 256\)"),
    "w13_scale nan": (lambda a: _weights(a, w13_scale=_e4m3_byte(a["w13_scale"], (3, 40, 1), 0x7F)),
                      r"w13_scale must hold e4m3 block scales >= 0 \(no NaN\), got NaN \(byte 0x7f\) at index \(3, 40, 1\)"),
    "w2_scale negative": (lambda a: _weights(a, w2_scale=_e4m3_byte(a["w2_scale"], (1, 2, 0), 0xC0)),
                          r"w2_scale must hold e4m3 block scales >= 0 \(no NaN\), got -2 \(byte 0xc0\) at index \(1, 2, 0\)"),
    "w13 rank": (lambda a: _weights(a, w13=a["w13"][0]),
                 r"w13 must be uint8 \[E, 2I, H/2\], got shape \(64, 32\)"),
    "w2_scale experts": (lambda a: _weights(a, w2_scale=a["w2_scale"][:3]),
                         r"w2_scale must have shape \[E, H, I/16\] = \(4, 64, 2\), got \(3, 64, 2\)"),
    "w13_global shape": (lambda a: _weights(a, w13_global=torch.ones(E, 3)),
                         r"w13_global must have shape \[E, 2\] \(gate, up\) or \[E, 2I\] \(per row\) = \(4, 2\), got \(4, 3\)"),
    "device": (lambda a: _weights(a, w2=a["w2"].to("meta")),
               r"all tensors must be on one device; w13 is on cpu but w2 is on meta"),
    "mx scale outside the kernels' window": (
        lambda a: _weights(a, w13_scale=_e8m0(E, 2 * INTER, H // 32),
                           w2_scale=_e8m0_byte(_e8m0(E, H, INTER // 32), (1, 5, 0), 0xFF)),
        r"w2_scale must hold MXFP4 scales in the kernels' range 2\^-118 \.\. 2\^8 \(UE8M0 "
        r"bytes 9\.\.135; nvfp4_ops.mxfp4_kernel_scales brings a checkpoint's scales there\), "
        r"got NaN \(byte 0xff\) at index \(1, 5, 0\) \(1 bad of 256\)"),
    "mx scale too small": (
        lambda a: _weights(a, w13_scale=_e8m0_byte(_e8m0(E, 2 * INTER, H // 32), (0, 3, 1), 8),
                           w2_scale=_e8m0(E, H, INTER // 32)),
        r"w13_scale must hold MXFP4 scales .* got 2\^-119 \(byte 0x08\) at index \(0, 3, 1\)"),
}


def _e8m0_byte(t: torch.Tensor, index: tuple, byte: int) -> torch.Tensor:
    b = t.view(torch.uint8).clone()
    b[index] = byte
    return b.view(torch.float8_e8m0fnu)


@pytest.mark.parametrize("case", list(MOE_WEIGHT_CASES))
def test_check_moe_weights_errors(moe_args, case):
    change, message = MOE_WEIGHT_CASES[case]
    with pytest.raises(NVFP4InputError, match=message):
        nvfp4_ops.check_moe_weights(**change(moe_args))


MLP_WEIGHT_CASES = {
    "w2_global nan": (dict(w2_global=torch.tensor(math.nan)),
                      r"nvfp4.mlp: w2_global must be finite and > 0, got nan \(1 bad of 1\)"),
    "w13_global zero": (dict(w13_global=torch.tensor([1.0, 0.0])),
                        r"nvfp4.mlp: w13_global must be finite and > 0, got 0.0 at index \(1,\)"),
    "w13_scale nan": ("w13_scale nan",
                      r"nvfp4.mlp: w13_scale must hold e4m3 block scales >= 0 \(no NaN\), got NaN"),
    "w2 shape": ("w2 shape", r"nvfp4.mlp: w2 must have shape \[H, I/2\] = \(64, 16\), got \(32, 16\)"),
}


@pytest.mark.parametrize("case", list(MLP_WEIGHT_CASES))
def test_check_mlp_weights_errors(moe_args, case):
    over, message = MLP_WEIGHT_CASES[case]
    w = {n: t[0] for n, t in _weights(moe_args).items()}
    if over == "w13_scale nan":
        over = dict(w13_scale=_e4m3_byte(w["w13_scale"], (0, 0), 0x7F))
    elif over == "w2 shape":
        over = dict(w2=moe_args["w2"][1, :32])
    w.update(over)
    with pytest.raises(NVFP4InputError, match=message):
        nvfp4_ops.check_mlp_weights(**w)


# --- per-call device data: NVFP4_OPS_VALUE_CHECKS=1 (debugging) --------------------------------


DEBUG_CASES = {
    "ids too large": (lambda a: {**a, "topk_ids": torch.full((5, K), 9, dtype=torch.int32)},
                      dict(global_num_experts=8),
                      r"topk_ids must be global expert ids in \[0, 8\), got min 9, max 9"),
    "ids negative": (lambda a: {**a, "topk_ids": -torch.ones(5, K, dtype=torch.int64)}, {},
                     r"topk_ids must be global expert ids in >= 0, got min -1"),
    "w2_global zero": (lambda a: {**a, "w2_global": torch.zeros(E)}, {},
                       r"nvfp4.moe: w2_global must be finite and > 0, got 0.0 at index \(0,\)"),
    "w13_scale nan": (lambda a: {**a, "w13_scale": _e4m3_byte(a["w13_scale"], (0, 0, 0), 0x7F)},
                      {}, r"nvfp4.moe: w13_scale must hold e4m3 block scales >= 0 \(no NaN\)"),
}


@pytest.mark.parametrize("case", list(DEBUG_CASES))
def test_moe_debug_value_errors(moe_args, case, monkeypatch):
    change, kwargs, message = DEBUG_CASES[case]
    monkeypatch.setenv("NVFP4_OPS_VALUE_CHECKS", "1")
    with pytest.raises(NVFP4InputError, match=message):
        _moe(change(moe_args), **kwargs)


def test_linear_debug_value_error(lin, monkeypatch):
    monkeypatch.setenv("NVFP4_OPS_VALUE_CHECKS", "on")
    with pytest.raises(NVFP4InputError,
                       match=r"nvfp4.linear: global_scale must be finite and > 0, got 0.0"):
        _linear({**lin, "global_scale": torch.tensor(0.0)})


def test_mlp_debug_value_error(moe_args, monkeypatch):
    monkeypatch.setenv("NVFP4_OPS_VALUE_CHECKS", "true")
    with pytest.raises(NVFP4InputError, match=r"nvfp4.mlp: w2_global must be finite and > 0"):
        _mlp(moe_args, w2_global=torch.tensor(math.nan))


def test_value_checks_switch_refuses_other_values(lin, monkeypatch):
    monkeypatch.setenv("NVFP4_OPS_VALUE_CHECKS", "maybe")
    with pytest.raises(ValueError, match=r"NVFP4_OPS_VALUE_CHECKS must be one of .*got 'maybe'"):
        _linear(lin)


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


DEQUANTIZE_VALUE_CASES = {
    "global nan": (lambda p, s, g: (p, s, torch.tensor(math.nan)),
                   r"nvfp4.dequantize: global_scale must be finite and > 0, got nan"),
    "global zero": (lambda p, s, g: (p, s, torch.tensor(0.0)),
                    r"nvfp4.dequantize: global_scale must be finite and > 0, got 0.0"),
    "global negative": (lambda p, s, g: (p, s, torch.tensor(-1.0)),
                        r"nvfp4.dequantize: global_scale must be finite and > 0, got -1.0"),
    "global per row inf": (lambda p, s, g: (p, s, torch.tensor([1.0, 1.0, math.inf, 1.0])),
                           r"nvfp4.dequantize: global_scale must be finite and > 0, got inf at index \(2,\)"),
    "block scale nan": (lambda p, s, g: (p, _e4m3_byte(s, (1, 1), 0x7F), g),
                        r"nvfp4.dequantize: block_scale must hold e4m3 block scales >= 0 \(no NaN\), got NaN"),
}


@pytest.mark.parametrize("case", list(DEQUANTIZE_VALUE_CASES))
def test_dequantize_refuses_bad_scales(case):
    change, message = DEQUANTIZE_VALUE_CASES[case]
    p, s, g = nvfp4_ops.quantize(torch.randn(4, 32))
    with pytest.raises(NVFP4InputError, match=message):
        nvfp4_ops.dequantize(*change(p, s, g))


MIXED_DEVICE_CASES = {
    "quantize meta scale": ("quantize", "global_scale",
                            r"nvfp4.quantize: all tensors must be on one device; x is on cpu but global_scale is on meta"),
    "dequantize meta global": ("dequantize", "global_scale",
                               r"nvfp4.dequantize: all tensors must be on one device; packed is on cpu but global_scale is on meta"),
    "dequantize meta block": ("dequantize", "block_scale",
                              r"nvfp4.dequantize: all tensors must be on one device; packed is on cpu but block_scale is on meta"),
}


@pytest.mark.parametrize("fake", [False, True], ids=["op", "fake"])
@pytest.mark.parametrize("case", list(MIXED_DEVICE_CASES))
def test_quantize_dequantize_mixed_devices(case, fake):
    """A scale on another device than the data is refused (it used to read uninitialised
    memory), by the op and by its fake (run under FakeTensorMode)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    which, moved, message = MIXED_DEVICE_CASES[case]
    x = torch.randn(4, 32)
    p, s, g = nvfp4_ops.quantize(x)
    args = dict(x=x, global_scale=g) if which == "quantize" else dict(packed=p, block_scale=s,
                                                                       global_scale=g)
    op = getattr(torch.ops.nvfp4, which)
    if not fake:
        args[moved] = args[moved].to("meta")
        with pytest.raises(NVFP4InputError, match=message):
            op(*args.values())
        return
    with FakeTensorMode() as mode:
        fargs = {n: mode.from_tensor(t) for n, t in args.items()}
        fargs[moved] = torch.empty(args[moved].shape, dtype=args[moved].dtype, device="meta")
        with pytest.raises(NVFP4InputError, match=message):
            op(*fargs.values())


def test_errors_surface_at_compile_time(lin):
    """Under torch.compile the fake runs the same shape checks while tracing."""
    bad = {**lin, "weight": lin["weight"][:, :16].contiguous()}
    fn = torch.compile(lambda x: nvfp4_ops.linear(x, bad["weight"], bad["weight_scale"],
                                                  bad["global_scale"]), fullgraph=True)
    with pytest.raises(Exception, match=r"weight must have shape \[N, K/2\]"):
        fn(lin["x"])


def test_data_write_after_a_good_check_is_caught_by_the_next_check(lin):
    """Nothing is cached: a scale overwritten through ``.data`` (as vLLM's loaders do; it does
    not bump the version counter) fails the next weight check."""
    g = lin["global_scale"].clone()
    nvfp4_ops.check_linear_weights(lin["weight"], lin["weight_scale"], g)
    g.data.fill_(math.nan)
    with pytest.raises(NVFP4InputError, match=r"global_scale must be finite and > 0, got nan"):
        nvfp4_ops.check_linear_weights(lin["weight"], lin["weight_scale"], g)


def test_data_write_after_a_good_call_is_caught_by_the_debug_checks(lin, monkeypatch):
    monkeypatch.setenv("NVFP4_OPS_VALUE_CHECKS", "1")
    g = lin["global_scale"].clone()
    args = {**lin, "global_scale": g}
    _linear(args)
    g.data.zero_()
    with pytest.raises(NVFP4InputError, match=r"global_scale must be finite and > 0, got 0.0"):
        _linear(args)


def test_inference_mode_tensors_are_checked(lin, monkeypatch):
    with torch.inference_mode():
        g = lin["global_scale"].clone()
        nvfp4_ops.check_linear_weights(lin["weight"], lin["weight_scale"], g)
        g.fill_(math.nan)
        with pytest.raises(NVFP4InputError, match=r"global_scale must be finite and > 0"):
            nvfp4_ops.check_linear_weights(lin["weight"], lin["weight_scale"], g)
        monkeypatch.setenv("NVFP4_OPS_VALUE_CHECKS", "1")
        with pytest.raises(NVFP4InputError, match=r"global_scale must be finite and > 0"):
            _linear({**lin, "global_scale": g})
