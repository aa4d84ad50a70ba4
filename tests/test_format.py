"""Bitwise tests of the NVFP4 format against independent, element-by-element definitions."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from nvfp4_ops import format as fmt

MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _brute_e2m1(v: float) -> int:
    """Nearest e2m1 code by exhaustive search; ties go to the even code (mantissa bit 0)."""
    mag = min(abs(v), 6.0)
    dists = [abs(mag - m) for m in MAGNITUDES]
    best = min(dists)
    candidates = [c for c, d in enumerate(dists) if d == best]
    code = next((c for c in candidates if c % 2 == 0), candidates[0])
    return code | (8 if v < 0 else 0)


def _byte_diff(actual: torch.Tensor, expected: torch.Tensor) -> str:
    diff = (actual.view(torch.uint8) != expected.view(torch.uint8)).nonzero()
    return f"{len(diff)} of {actual.numel()} bytes differ, first at {diff[:5].tolist()}"


def test_e2m1_values_table():
    assert fmt.E2M1_VALUES[:8] == tuple(MAGNITUDES)
    assert fmt.E2M1_VALUES[8:] == tuple(-m for m in MAGNITUDES)
    codes = torch.arange(16, dtype=torch.uint8)
    assert fmt.e2m1_to_float(codes).tolist() == list(fmt.E2M1_VALUES)


def test_pack_low_nibble_is_even_element():
    codes = torch.tensor([[0x1, 0xA, 0x7, 0xF]], dtype=torch.uint8)
    packed = fmt.pack_e2m1(codes)
    assert packed.tolist() == [[0xA1, 0xF7]]
    assert torch.equal(fmt.unpack_e2m1(packed), codes)


def test_pack_unpack_roundtrip_all_bytes():
    packed = torch.arange(256, dtype=torch.uint8).reshape(4, 64)
    assert torch.equal(fmt.pack_e2m1(fmt.unpack_e2m1(packed)), packed)


@pytest.mark.parametrize(
    "value, code",
    [(0.25, 0), (0.26, 1), (0.75, 2), (1.25, 2), (1.26, 3), (1.75, 4), (2.5, 4), (2.6, 5),
     (3.5, 6), (5.0, 6), (5.01, 7), (7.0, 7), (1e9, 7), (-0.75, 10), (-5.0, 14), (-0.1, 8)],
)
def test_rounding_ties_and_saturation(value, code):
    assert fmt.float_to_e2m1(torch.tensor([value])).item() == code


def test_rounding_matches_brute_force():
    torch.manual_seed(0)
    values = torch.cat([
        torch.randn(4000) * 3,
        torch.tensor([m + d for m in MAGNITUDES for d in (-0.25, 0.0, 0.25)]),
        -torch.tensor([m + d for m in MAGNITUDES for d in (-0.25, 0.0, 0.25)]),
    ])
    got = fmt.float_to_e2m1(values)
    want = torch.tensor([_brute_e2m1(v) for v in values.tolist()], dtype=torch.uint8)
    assert torch.equal(got, want), _byte_diff(got, want)


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _quantize_elementwise(x: torch.Tensor):
    """The recipe of format.py's docstring, one element at a time in plain Python floats
    (fp32 steps emulated with struct round trips, e4m3 through torch's scalar cast)."""
    rows, k = x.shape
    xs = x.float().tolist()
    amax = max((abs(v) for row in xs for v in row), default=0.0)
    gs = _f32(amax / _f32(6.0 * 448.0)) if amax > 0 else 1.0
    codes = [[0] * k for _ in range(rows)]
    scales = [[0.0] * (k // 16) for _ in range(rows)]
    for r in range(rows):
        for b in range(k // 16):
            block = xs[r][16 * b:16 * b + 16]
            raw = min(_f32(max(abs(v) for v in block) / _f32(6.0 * gs)), 448.0)
            s = torch.tensor(raw).to(torch.float8_e4m3fn).float().item()
            scales[r][b] = s
            div = _f32(s * gs)
            for i, v in enumerate(block):
                codes[r][16 * b + i] = _brute_e2m1(_f32(v / div)) if div > 0 else 0
    packed = fmt.pack_e2m1(torch.tensor(codes, dtype=torch.uint8))
    return packed, torch.tensor(scales).to(torch.float8_e4m3fn), torch.tensor(gs)


@pytest.mark.parametrize("seed", [0, 1])
def test_quantize_bitwise_vs_elementwise_recipe(seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(6, 64, generator=g) * torch.logspace(-3, 1, 64)).to(torch.bfloat16)
    x[2, 16:32] = 0  # an all-zero block
    x[3, 0:16] *= 1e-6  # a block whose scale lands in e4m3 subnormals or zero
    packed, scale, gs = fmt.quantize(x)
    want_p, want_s, want_g = _quantize_elementwise(x)
    assert gs.item() == want_g.item()
    assert torch.equal(scale.view(torch.uint8), want_s.view(torch.uint8)), _byte_diff(scale,
                                                                                     want_s)
    assert torch.equal(packed, want_p), _byte_diff(packed, want_p)


def test_dequantize_is_exact():
    torch.manual_seed(1)
    packed = torch.randint(0, 256, (8, 32), dtype=torch.uint8)
    scale = (torch.rand(8, 4) * 3 + 0.01).to(torch.float8_e4m3fn)
    gs = torch.tensor(0.0123456789, dtype=torch.float32)
    got = fmt.dequantize(packed, scale, gs)
    # e2m1 * e4m3 is exact in fp64 and in fp32; the product with gs is rounded once.
    vals = fmt.e2m1_to_float(fmt.unpack_e2m1(packed)).double()
    want = (vals * scale.double().repeat_interleave(16, dim=1) * gs.double()).float()
    assert torch.equal(got, want)
    decoded = fmt.decode(packed, scale)
    assert torch.equal(decoded.to(torch.bfloat16).float(), decoded), "decode not exact in bf16"


def test_dequantize_per_row_global_scale():
    p, s, _ = fmt.quantize(torch.randn(3, 32))
    gs = torch.tensor([1.0, 2.0, 0.5])
    rows = fmt.dequantize(p, s, gs)
    for r in range(3):
        assert torch.equal(rows[r], fmt.dequantize(p[r], s[r], gs[r]))


def test_roundtrip_of_representable_values():
    """Values already on the NVFP4 grid of their scales survive quantize -> dequantize."""
    torch.manual_seed(2)
    codes = torch.randint(0, 16, (4, 64), dtype=torch.uint8)
    codes[:, 0] = 7  # every block reaches amax 6 * scale, so the block scale is recovered
    codes[:, 16::16] = 15
    scale = torch.tensor([1.0, 2.0, 0.5, 4.0]).repeat_interleave(4).reshape(4, 4)
    gs = torch.tensor(1.0)
    x = fmt.dequantize(fmt.pack_e2m1(codes), scale.to(torch.float8_e4m3fn), gs)
    packed, s, g = fmt.quantize(x, gs)
    assert torch.equal(fmt.dequantize(packed, s, g), x)


def test_all_zero_tensor():
    packed, scale, gs = fmt.quantize(torch.zeros(2, 32, dtype=torch.bfloat16))
    assert gs.item() == 1.0
    assert packed.count_nonzero() == 0 and scale.float().count_nonzero() == 0
    assert fmt.dequantize(packed, scale, gs).count_nonzero() == 0


def test_underflowing_block_flushes_to_zero():
    x = torch.zeros(1, 32)
    x[0, 0] = 1000.0  # sets the global scale
    x[0, 16:] = 1e-9  # block 1: its scale underflows e4m3 to 0
    packed, scale, gs = fmt.quantize(x)
    assert scale[0, 1].float().item() == 0.0
    assert fmt.unpack_e2m1(packed)[0, 16:].count_nonzero() == 0
    deq = fmt.dequantize(packed, scale, gs)
    assert deq[0, 0].item() == pytest.approx(1000.0, rel=0.01)
    assert torch.all(deq[0, 16:] == 0)


def test_largest_block_scale_saturates_at_448_not_nan():
    x = torch.randn(4, 64) * 37.0
    _, scale, _ = fmt.quantize(x)
    assert not torch.isnan(scale.float()).any()
    assert scale.float().max().item() == 448.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_input_raises(bad):
    x = torch.randn(2, 32)
    x[1, 5] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        fmt.quantize(x)


def test_explicit_global_scale_is_used_and_validated():
    x = torch.randn(2, 32)
    _, _, gs = fmt.quantize(x, torch.tensor(0.5))
    assert gs.item() == 0.5
    with pytest.raises(ValueError, match="finite and > 0"):
        fmt.quantize(x, torch.tensor(0.0))
