"""MXFP4 (OCP MX, DeepSeek's routed experts) in ``nvfp4_ops.format`` and the exact conversion
``nvfp4::mxfp4_to_nvfp4`` (CPU): bitwise unpack/dequantize, UE8M0 edge codes, the quantizer
against an independent element-wise recipe, the conversion's exactness and its refusals,
opcheck, fakes, torch.compile. Also the NVFP4 ``quantize`` refusal of tiny tensors."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import nvfp4_ops
from nvfp4_ops import format as fmt
from nvfp4_ops.testing import spread_mxfp4

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _f32_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _value(code: int) -> float:
    """e2m1 code -> value, from the bit fields (sign, 2 exponent bits, 1 mantissa bit)."""
    sign = -1.0 if code & 8 else 1.0
    exp, man = (code >> 1) & 3, code & 1
    mag = man * 0.5 if exp == 0 else (1 + man / 2) * 2.0 ** (exp - 1)
    return sign * mag


def _dequant_elementwise(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Independent MXFP4 dequantization, one Python float per element (math.ldexp)."""
    rows = packed.reshape(-1, packed.shape[-1]).tolist()
    srows = scale.reshape(-1, scale.shape[-1]).tolist()
    out = []
    for prow, srow in zip(rows, srows, strict=True):
        vals = []
        for j, byte in enumerate(prow):
            for k, code in ((2 * j, byte & 0xF), (2 * j + 1, byte >> 4)):
                vals.append(math.ldexp(_value(code), srow[k // 32] - 127))
        out.append(vals)
    k = packed.shape[-1] * 2
    return torch.tensor(out, dtype=torch.float64).reshape(*packed.shape[:-1], k).float()


def _rne_e2m1(q: float) -> int:
    """Nearest e2m1 code to q (already divided by its scale), ties to the even code,
    saturating at +-6; negative values keep the sign bit."""
    mag = min(abs(q), 6.0)
    best = min(range(8), key=lambda c: (abs(E2M1[c] - mag), c & 1))
    return best | (8 if q < 0 else 0)


def _quantize_elementwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The OCP MX recipe written per element with Python floats (math.frexp)."""
    rows = x.float().reshape(-1, x.shape[-1]).tolist()
    codes, scales = [], []
    for row in rows:
        crow, srow = [], []
        for b in range(0, len(row), 32):
            block = row[b:b + 32]
            amax = max(abs(v) for v in block)
            shared = -127 if amax == 0 else max(-127, min(127, math.frexp(amax)[1] - 1 - 2))
            srow.append(shared + 127)
            crow += [_rne_e2m1(math.ldexp(v, -shared)) for v in block]
        codes.append(crow)
        scales.append(srow)
    k = x.shape[-1]
    c = torch.tensor(codes, dtype=torch.uint8).reshape(*x.shape[:-1], k)
    packed = c[..., 0::2] | (c[..., 1::2] << 4)
    return packed, torch.tensor(scales, dtype=torch.uint8).reshape(*x.shape[:-1], k // 32)


def _diff(a: torch.Tensor, b: torch.Tensor) -> str:
    bad = (a.view(torch.uint8) != b.view(torch.uint8)).nonzero()
    return f"{len(bad)} bytes differ, first at {bad[:3].tolist()}"


# ---------------------------------------------------------------- UE8M0 and unpacking


def test_ue8m0_edge_codes():
    codes = torch.tensor([0x00, 0x01, 0x7F, 0x80, 0xFE], dtype=torch.uint8)
    got = fmt.ue8m0_to_float(codes)
    want = [_f32_bits(0x00400000), _f32_bits(0x00800000), 1.0, 2.0, _f32_bits(0xFE << 23)]
    assert got.dtype == torch.float32 and got.tolist() == want
    assert want[0] == 2.0 ** -127 and want[-1] == 2.0 ** 127
    # every finite code, against math.ldexp and against torch's own e8m0 conversion
    allc = torch.arange(255, dtype=torch.uint8)
    vals = fmt.ue8m0_to_float(allc)
    assert vals.tolist() == [math.ldexp(1.0, c - 127) for c in range(255)]
    assert torch.equal(fmt.ue8m0_to_float(allc.view(torch.float8_e8m0fnu)), vals)
    assert torch.equal(allc.view(torch.float8_e8m0fnu).float(), vals)


def test_ue8m0_nan_code_raises_with_position():
    s = torch.full((3, 4), 127, dtype=torch.uint8)
    s[2, 1] = 0xFF
    s[2, 3] = 0xFF
    with pytest.raises(ValueError, match=r"scale\[2, 1\] is 0xFF.*2 of 12"):
        fmt.ue8m0_to_float(s)
    with pytest.raises(TypeError, match="uint8 or float8_e8m0fnu"):
        fmt.ue8m0_to_float(s.float())


def test_low_nibble_is_the_even_element():
    packed = torch.tensor([[0x21] + [0] * 15], dtype=torch.uint8)  # k0 = code 1, k1 = code 2
    out = fmt.mxfp4_dequantize(packed, torch.tensor([[128]], dtype=torch.uint8))
    assert out[0, :3].tolist() == [1.0, 2.0, 0.0]  # (0.5, 1.0) times 2^1


def test_dequantize_all_bytes_and_edge_scales_bitwise():
    """Every byte value under every edge scale (and random ones) against the element-wise
    dequantization: bitwise equal (overflow to inf included)."""
    packed = torch.arange(256, dtype=torch.uint8).reshape(16, 16).repeat(1, 2)  # K = 64
    scale = torch.tensor([[0x00, 0x7F], [0xFE, 0x01]], dtype=torch.uint8).repeat(8, 1)
    got = fmt.mxfp4_dequantize(packed, scale)
    want = _dequant_elementwise(packed, scale)
    assert torch.equal(got, want)
    assert got.isinf().any()  # 0xFE with |e2m1| >= 2 overflows fp32, on both sides
    gen = torch.Generator().manual_seed(1)
    packed = torch.randint(0, 256, (3, 5, 48), dtype=torch.uint8, generator=gen)
    scale = torch.randint(0, 255, (3, 5, 3), dtype=torch.uint8, generator=gen)
    assert torch.equal(fmt.mxfp4_dequantize(packed, scale), _dequant_elementwise(packed, scale))
    assert torch.equal(fmt.mxfp4_dequantize(packed, scale.view(torch.float8_e8m0fnu)),
                       fmt.mxfp4_dequantize(packed, scale))


def test_dequantize_refuses_bad_arguments():
    p = torch.zeros(2, 32, dtype=torch.uint8)
    with pytest.raises(ValueError, match="K/32"):
        fmt.mxfp4_dequantize(p, torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(TypeError, match="float8_e8m0fnu"):
        fmt.mxfp4_dequantize(p, torch.zeros(2, 2))
    s = torch.full((2, 2), 127, dtype=torch.uint8)
    s[1, 0] = 0xFF
    with pytest.raises(ValueError, match=r"scale\[1, 0\] is 0xFF"):
        fmt.mxfp4_dequantize(p, s)


# ---------------------------------------------------------------- quantizer


def _spread(shape, gen, lo=-30, hi=30):
    """Gaussian blocks of 32 with block magnitudes 2^[lo, hi)."""
    x = torch.randn(*shape, generator=gen)
    blocks = x.reshape(*shape[:-1], shape[-1] // 32, 32)
    exps = torch.randint(lo, hi, (*blocks.shape[:-1], 1), generator=gen).float()
    return (blocks * torch.exp2(exps)).reshape(shape)


@pytest.mark.parametrize("seed", [0, 1])
def test_quantize_bitwise_vs_elementwise_recipe(seed):
    gen = torch.Generator().manual_seed(seed)
    x = _spread((6, 256), gen)
    x[0, :32] = 0.0  # an all-zero block
    x[0, 32:64] = -0.0
    x[1, :64] = torch.tensor(E2M1 * 8) * 2.0 ** -5  # exactly representable values
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4)
    x[2, :32] = ties * 2.0 ** 3  # amax 6: every rounding tie, scaled
    x[2, 32:64] = -ties
    x[3, :32] = 1e-40  # subnormal block: exponent clamps to -127, codes round to 0
    x[3, 32:64] = 3e38  # near fp32 max
    x[4, :32] = torch.linspace(-7.9, 7.9, 32)  # values up to amax / 2^shared < 8 saturate
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        xi = x.to(dtype) if dtype is torch.float32 else x.clamp(-6e4, 6e4).to(dtype)
        got_p, got_s = fmt.mxfp4_quantize(xi)
        want_p, want_s = _quantize_elementwise(xi)
        assert got_p.dtype == torch.uint8 and got_s.dtype == torch.uint8
        assert torch.equal(got_s, want_s), _diff(got_s, want_s)
        assert torch.equal(got_p, want_p), _diff(got_p, want_p)
    assert got_s[0, 0] == 0 and (got_p[0, :32] == 0).all()


def test_quantize_round_trips_representable_values():
    gen = torch.Generator().manual_seed(3)
    packed = torch.randint(0, 256, (4, 8, 64), dtype=torch.uint8, generator=gen)
    scale = torch.randint(27, 227, (4, 8, 4), dtype=torch.uint8, generator=gen)
    values = fmt.mxfp4_dequantize(packed, scale)
    again = fmt.mxfp4_dequantize(*fmt.mxfp4_quantize(values))
    assert torch.equal(again, values)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_quantize_refuses_non_finite(bad):
    x = torch.ones(2, 64)
    x[1, 7] = bad
    with pytest.raises(ValueError, match="NaN or Inf"):
        fmt.mxfp4_quantize(x)
    with pytest.raises(ValueError, match="K % 32"):
        fmt.mxfp4_quantize(torch.ones(2, 48))


# ---------------------------------------------------------------- the conversion


def _check_exact(packed, scale, block, glob):
    nv = fmt.dequantize(packed, block, glob)
    mx = fmt.mxfp4_dequantize(packed, scale)
    assert torch.equal(nv, mx), f"{int((nv != mx).sum())} values differ"
    assert torch.equal(nvfp4_ops.dequantize(packed, block, glob), mx)


def test_conversion_exact_over_a_wide_exponent_range():
    """Block exponents spread over ~200 binades across one tensor (<= 18 within each row): the
    NVFP4 dequantization with per-row global scales is bitwise the MXFP4 one."""
    gen = torch.Generator().manual_seed(5)
    packed, scale = spread_mxfp4((3, 40, 512), gen)
    exps = scale.int() - 127
    assert exps.max() - exps.min() >= 150
    # 0xFE only with magnitudes < 2 (larger ones overflow fp32, see the inf test)
    scale[0, 0, :] = torch.tensor([0xFE] + [0xFE - i for i in range(1, 16)], dtype=torch.uint8)
    packed[0, 0] &= 0x33
    block, glob = nvfp4_ops.mxfp4_to_nvfp4(packed, scale, name="experts.w13")
    assert block.dtype == torch.float8_e4m3fn and block.shape == (3, 40, 32)
    assert glob.dtype == torch.float32 and glob.shape == (3, 40)
    _check_exact(packed, scale, block, glob)
    # the global scales are normal powers of two, the block scales powers of two or 0,
    # and both 16-blocks of a 32-block carry the same scale
    mant, _ = torch.frexp(glob)
    assert (mant == 0.5).all() and (glob >= torch.finfo(torch.float32).tiny).all()
    b = block.float()
    nz = b > 0
    assert (torch.frexp(b[nz])[0] == 0.5).all()
    assert torch.equal(block.view(torch.uint8)[..., 0::2], block.view(torch.uint8)[..., 1::2])
    assert int(nz.sum()) > 0.9 * b.numel()


def test_conversion_chunks_give_the_same_answer(monkeypatch):
    gen = torch.Generator().manual_seed(6)
    packed, scale = spread_mxfp4((5, 16, 256), gen)
    whole = fmt.mxfp4_to_nvfp4(packed, scale)
    monkeypatch.setattr(fmt, "_CONVERT_CHUNK_BLOCKS", 24)  # 3 rows per chunk
    chunked = fmt.mxfp4_to_nvfp4(packed, scale)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
               if a.dtype == torch.float8_e4m3fn else torch.equal(a, b)
               for a, b in zip(whole, chunked, strict=True))
    _check_exact(packed, scale, *chunked)


def test_conversion_of_zero_blocks_rows_and_tiny_rows():
    gen = torch.Generator().manual_seed(7)
    packed, scale = spread_mxfp4((4, 8, 256), gen)
    zero = packed[0, 0].clone()
    zero[:16] = 0x80  # block 0: codes 0 and 8 (+0 / -0) only
    zero[16:32] = 0x08
    packed[0, 0] = zero
    scale[0, 0, 0] = 0x00  # 2^-127: far below the row's range, but the block is all zero
    scale[0, 0, 1] = 0xFE
    packed[0, 0, 16:32] = 0  # ... and so is block 1 at 2^127
    packed[1, 2] = 0  # a row of only zero blocks, with arbitrary scales
    # e_max = -119: 2^(e_max - 8) would be subnormal, so the global scale is 2^-126
    scale[2, 3] = torch.tensor([0, 1, 2, 3, 8, 0, 4, 7], dtype=torch.uint8)
    packed[2, 3, 64:80] |= 0x11  # block 4 (the row's largest exponent) is non-zero
    block, glob = nvfp4_ops.mxfp4_to_nvfp4(packed, scale.view(torch.float8_e8m0fnu))
    _check_exact(packed, scale, block, glob)
    assert (block[0, 0, :4].float() == 0).all()  # both zero blocks get scale 0
    assert glob[1, 2] == 1.0 and (block[1, 2].float() == 0).all()
    assert glob[2, 3] == 2.0 ** -126


def test_conversion_refuses_a_row_beyond_18_binades():
    gen = torch.Generator().manual_seed(8)
    packed, scale = spread_mxfp4((3, 6, 256), gen, span=18)
    nvfp4_ops.mxfp4_to_nvfp4(packed, scale)  # 18 binades: fine
    scale[2, 4] = 127
    scale[2, 4, 5] = 127 - 18  # 19 binades in row (2, 4)
    packed[2, 4, 5 * 16:6 * 16] |= 0x01  # make sure block 5 holds a non-zero code
    with pytest.raises(nvfp4_ops.NVFP4InputError) as info:
        nvfp4_ops.mxfp4_to_nvfp4(packed, scale, name="layers.7.ffn.experts w2_weight_scale")
    msg = str(info.value)
    assert msg.startswith("layers.7.ffn.experts w2_weight_scale: nvfp4.mxfp4_to_nvfp4")
    assert "row [2, 4]" in msg and "block 5" in msg and "exponent -18" in msg
    assert "-18..0" in msg, msg
    # the same block with only +-0 codes is not a constraint
    packed[2, 4, 5 * 16:6 * 16] &= 0x88
    block, glob = nvfp4_ops.mxfp4_to_nvfp4(packed, scale)
    _check_exact(packed, scale, block, glob)


def test_conversion_refuses_nan_scales_even_on_zero_blocks():
    packed = torch.zeros(2, 3, 64, dtype=torch.uint8)
    scale = torch.full((2, 3, 4), 127, dtype=torch.uint8)
    scale[1, 2, 3] = 0xFF
    with pytest.raises(nvfp4_ops.NVFP4InputError,
                       match=r"^w13: nvfp4\.mxfp4_to_nvfp4: scale\[1, 2, 3\] is 0xFF"):
        nvfp4_ops.mxfp4_to_nvfp4(packed, scale, name="w13")


def test_conversion_keeps_overflowing_values_equal():
    """0xFE with |e2m1| >= 2 is +-inf in fp32 on both sides (nothing can hold it)."""
    packed = torch.full((1, 16), 0x7F, dtype=torch.uint8)  # codes 15 (-6) and 7 (6)
    scale = torch.tensor([[0xFE]], dtype=torch.uint8)
    block, glob = nvfp4_ops.mxfp4_to_nvfp4(packed, scale)
    assert glob.item() == 2.0 ** 119
    _check_exact(packed, scale, block, glob)


@pytest.mark.parametrize("case", ["weight dtype", "scale dtype", "scale shape", "K % 32",
                                  "device", "scalar"])
def test_conversion_meta_errors_in_op_and_fake(case):
    w = torch.zeros(4, 32, dtype=torch.uint8)
    s = torch.full((4, 2), 127, dtype=torch.uint8)
    if case == "weight dtype":
        w = w.to(torch.int8)
    elif case == "scale dtype":
        s = s.float()
    elif case == "scale shape":
        s = s[:, :1]
    elif case == "K % 32":
        w, s = w[:, :24], s[:, :1]
    elif case == "device":
        s = s.to("meta")
    else:
        w = w[0, 0]
    word = {"weight dtype": "weight", "scale dtype": "scale", "scale shape": "scale",
            "K % 32": "K % 32", "device": "device", "scalar": "scalar"}[case]
    with pytest.raises(nvfp4_ops.NVFP4InputError, match=word):
        nvfp4_ops.mxfp4_to_nvfp4(w, s, name="t")
    if case != "device":
        with FakeTensorMode() as mode, pytest.raises(nvfp4_ops.NVFP4InputError, match=word):
            torch.ops.nvfp4.mxfp4_to_nvfp4(mode.from_tensor(w), mode.from_tensor(s))


def test_fake_shapes_without_reading_data():
    with FakeTensorMode():
        w = torch.empty(384, 6144, 3584, dtype=torch.uint8)  # V4-Pro w13: never allocated
        s = torch.empty(384, 6144, 224, dtype=torch.float8_e8m0fnu)
        block, glob = torch.ops.nvfp4.mxfp4_to_nvfp4(w, s)
    assert block.shape == (384, 6144, 448) and block.dtype == torch.float8_e4m3fn
    assert glob.shape == (384, 6144) and glob.dtype == torch.float32
    w = torch.empty(2, 7, 16, dtype=torch.uint8, device="meta")
    block, glob = torch.ops.nvfp4.mxfp4_to_nvfp4(w, torch.empty(2, 7, 1, dtype=torch.uint8,
                                                                device="meta"))
    assert block.shape == (2, 7, 2) and glob.shape == (2, 7) and block.device.type == "meta"


def test_opcheck():
    gen = torch.Generator().manual_seed(9)
    packed, scale = spread_mxfp4((2, 8, 128), gen)
    # uint8 scales with every default util (torch's schema check cannot compare float8 inputs
    # on the CPU, CONTRIBUTING); the e8m0 form with the others
    torch.library.opcheck(torch.ops.nvfp4.mxfp4_to_nvfp4.default, (packed, scale))
    torch.library.opcheck(torch.ops.nvfp4.mxfp4_to_nvfp4.default,
                          (packed, scale.view(torch.float8_e8m0fnu)),
                          test_utils=("test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_compiled_wrapper_matches_eager():
    gen = torch.Generator().manual_seed(10)
    packed, scale = spread_mxfp4((3, 16, 256), gen)
    torch._dynamo.reset()
    compiled = torch.compile(lambda w, s: nvfp4_ops.mxfp4_to_nvfp4(w, s, name="w"),
                             fullgraph=True)
    got = compiled(packed, scale)
    want = nvfp4_ops.mxfp4_to_nvfp4(packed, scale)
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(got[1], want[1])


# ---------------------------------------------------------------- NVFP4 quantize: tiny tensors


def test_nvfp4_quantize_refuses_a_tensor_too_small_for_a_normal_global_scale():
    """amax 1e-42 used to give global scale 0.0 (which every op rejects); anything whose
    global scale amax / 2688 would be subnormal is refused with a clear error."""
    tiny = torch.full((2, 16), 1e-42)
    with pytest.raises(nvfp4_ops.NVFP4InputError, match=r"x is too small.*amax 1\.0\d*e-42"):
        nvfp4_ops.quantize(tiny)
    with pytest.raises(ValueError, match="below fp32's normal range"):
        fmt.quantize(torch.full((1, 16), 1e-36))
    # the smallest amax that is accepted: the global scale is then exactly 2^-126, and the
    # values round-trip exactly (6 = the largest code, 448 = the largest block scale)
    edge = torch.zeros(1, 32)
    edge[0, 3] = 6 * 448 * 2.0 ** -126
    packed, scale, glob = nvfp4_ops.quantize(edge)
    assert glob.item() == 2.0 ** -126
    assert torch.equal(fmt.dequantize(packed, scale, glob), edge)
    below = edge.clone()
    below[0, 3] = torch.nextafter(below[0, 3], torch.tensor(0.0))
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="too small"):
        nvfp4_ops.quantize(below)
    # zero stays legal; an explicit global scale is still honoured
    assert nvfp4_ops.quantize(torch.zeros(1, 16))[2].item() == 1.0
    _, _, g = nvfp4_ops.quantize(tiny, torch.tensor(2.0 ** -140))
    assert g.item() == 2.0 ** -140
