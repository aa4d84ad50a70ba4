"""The ``wperm`` bit order (:mod:`nvfp4_ops.orders.wperm`): the permutation, the
decoder's integer part against ``pair4``'s, and the kernels that read it compile for sm_90a
with fewer decode instructions."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from nvfp4_ops.orders import WeightOrder
from nvfp4_ops.orders import wperm as W
from nvfp4_ops.testing import kernel_ptx


def _words(w: torch.Tensor) -> torch.Tensor:
    return w.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def test_source_bit_is_a_permutation():
    src = W.source_bit()
    assert sorted(src) == list(range(32))
    assert src != tuple(range(32))


def test_decoder_matches_pair4_on_every_word():
    """Both decoders OR disjoint masked shifts of the word, so every output bit is one input
    bit or 0: they agree on all 2^32 words iff they agree on 0 and the 32 one-bit words."""
    basis = torch.tensor([0] + [1 << b for b in range(32)], dtype=torch.int64)
    ckpt = basis.to(torch.uint32 if hasattr(torch, "uint32") else torch.int64)
    ckpt_bytes = torch.tensor(
        [[(int(v) >> (8 * i)) & 0xFF for i in range(4)] for v in ckpt], dtype=torch.uint8)
    perm = W.to_wperm(ckpt_bytes)
    got = W.emulate_wperm(_words(perm))
    want = W.emulate_pair4(_words(ckpt_bytes))
    assert torch.equal(got, want)
    # and each input bit lands somewhere: the decode loses no code bit
    assert (want[:, 1:] != 0).any(dim=0).all()


def test_decoded_values_are_e2m1():
    """Register j = (code j, code j+4) as bf16 ``e2m1 * 2^-126`` (the scale multiply follows)."""
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    gen = torch.Generator().manual_seed(0)
    w = torch.randint(0, 256, (64, 32), dtype=torch.uint8, generator=gen)
    regs = W.emulate_wperm(_words(W.to_wperm(w)))  # [4, 64, 8]
    words = _words(w)
    for j in range(4):
        for half, code in ((0, j), (16, j + 4)):
            nib = (words >> (4 * code)) & 0xF
            want = e2m1[nib & 7] * torch.where(nib >= 8, -1.0, 1.0)
            bits = ((regs[j] >> half) & 0xFFFF).to(torch.int32).to(torch.int16)
            got = bits.view(torch.bfloat16).float() * 2.0**126
            assert torch.equal(got, want)


def test_round_trip_and_errors():
    w = torch.randint(0, 256, (3, 5, 64), dtype=torch.uint8)
    p = W.to_wperm(w)
    assert p.shape == w.shape and p.dtype == torch.uint8
    assert torch.equal(W.from_wperm(p), w)
    with pytest.raises(ValueError, match="multiple of 4"):
        W.to_wperm(torch.zeros(4, 6, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        W.to_wperm(torch.zeros(4, 8, dtype=torch.int32))


os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


@pytest.mark.parametrize("family", ["stream", "wgmma"])
def test_wperm_kernels_compile(family, tmp_path):
    """The streamed (dense and MoE) and WGMMA (MoE ``kperm``) kernels with ``wperm`` compile
    for sm_90a; per decoded word the PTX has 13 shift / logic ops instead of 20 (ptxas fuses
    and/or pairs into LOP3: 11 SASS instructions instead of 16), and the same MMAs."""
    pytest.importorskip("cutlass")
    from nvfp4_ops.kernels.dispatch import plan_gemm

    if family == "stream":
        base = plan_gemm(7168, 18432, 8).config
        mma = "mma.sync"
    else:
        base = plan_gemm(4096, 4096, 16, epilogue="swiglu", grouped=True, permuted=True).config
        mma = "wgmma.mma_async"
    counts = {}
    for wp in (False, True):
        cfg = dataclasses.replace(base, order=WeightOrder.WPERM if wp else WeightOrder.CHECKPOINT)
        assert cfg.name.endswith("_wp_sm_90a") == wp
        text = kernel_ptx(cfg, tmp_path / str(wp))
        counts[wp] = {op: text.count(op) for op in
                      ("shl.b32", "shr.u32", "shr.b32", "and.b32", "or.b32", "mul.rn.bf16x2", mma)}
        # the decoders' multiplies only, not the block scales' 2^119 prescale (fp4_ptx)
        counts[wp]["mul.rn.bf16x2"] -= text.count("mul.rn.bf16x2 pk, pk,")
    words = counts[False]["mul.rn.bf16x2"] // 4
    assert words > 0 and counts[True]["mul.rn.bf16x2"] == 4 * words
    assert counts[True][mma] == counts[False][mma] > 0

    def int_ops(c):
        return sum(c[op] for op in ("shl.b32", "shr.u32", "shr.b32", "and.b32", "or.b32"))

    # the rest of the kernel's integer ops are the same in both builds
    assert int_ops(counts[False]) - int_ops(counts[True]) == (20 - 13) * words


def test_wgmma_wperm_needs_kperm():
    pytest.importorskip("cutlass")
    from nvfp4_ops.kernels.dispatch import plan_gemm

    base = plan_gemm(4096, 4096, 16, epilogue="swiglu", grouped=True).config
    with pytest.raises(ValueError, match="WPERM order needs kperm"):
        dataclasses.replace(base, order=WeightOrder.WPERM)


# --- the prepared layout through the ops -------------------------------------------------


def test_to_wperm_op_in_place_and_checked():
    import nvfp4_ops
    from nvfp4_ops import NVFP4InputError

    w = torch.randint(0, 256, (2, 16, 64), dtype=torch.uint8)
    w0 = w.clone()
    assert nvfp4_ops.to_wperm_(w) is w
    assert torch.equal(w, W.to_wperm(w0)) and not torch.equal(w, w0)
    nvfp4_ops.to_wperm_(w, inverse=True)
    assert torch.equal(w, w0)
    torch.library.opcheck(torch.ops.nvfp4.to_wperm_.default, (w.clone(), False))
    with pytest.raises(NVFP4InputError, match="uint8"):
        nvfp4_ops.to_wperm_(w.to(torch.int16))
    with pytest.raises(NVFP4InputError, match="multiple of 4"):
        nvfp4_ops.to_wperm_(torch.zeros(4, 6, dtype=torch.uint8))
    with pytest.raises(NVFP4InputError, match="contiguous"):
        nvfp4_ops.to_wperm_(w.transpose(1, 2))


def test_moe_with_wperm_weights_is_bitwise_the_same():
    """The CPU reference undoes the order exactly: the same output, bit for bit."""
    import nvfp4_ops
    from nvfp4_ops.testing import random_experts, random_routing

    torch.manual_seed(3)
    ex = random_experts(6, 256, 128, up_scale_ratio=4.0)
    x = torch.randn(9, 256).to(torch.bfloat16)
    ids, weights = random_routing(9, 6, 2)
    want = nvfp4_ops.moe(x, ids, weights, *ex.args(), swiglu_limit=7.0)
    w13, w2 = ex.w13.clone(), ex.w2.clone()
    nvfp4_ops.to_wperm_(w13)
    nvfp4_ops.to_wperm_(w2)
    got = nvfp4_ops.moe(x, ids, weights, w13, ex.w13_scale, ex.w13_global, w2, ex.w2_scale,
                        ex.w2_global, swiglu_limit=7.0, wperm=True)
    assert torch.equal(got, want)
    # the flag matters: the permuted codes read as checkpoint codes are other weights
    wrong = nvfp4_ops.moe(x, ids, weights, w13, ex.w13_scale, ex.w13_global, w2, ex.w2_scale,
                          ex.w2_global, swiglu_limit=7.0)
    assert not torch.equal(wrong, want)


def test_wperm_dispatch():
    """Which configs read wperm: the MoE's GEMMs at V4 sizes at every tile; dense configs
    refuse it alone (dense weights take it with the fragment order); the compile set has a
    wperm twin of each MoE GEMM config."""
    pytest.importorskip("cutlass")
    from nvfp4_ops import _warmup, get_shape
    from nvfp4_ops.kernels.dispatch import WeightOrder, moe_wperm_supported, plan_gemm

    for name in ("v4-flash", "v4-pro"):
        s = get_shape(name)
        assert moe_wperm_supported(s.hidden, s.intermediate)
    assert not moe_wperm_supported(256, 128)  # K % 256 at the 8-token tile: mma.sync
    moe = dict(epilogue="swiglu", grouped=True, m_tiles=4, permuted=True, chained=True)
    for bm in (8, 16, 128):
        cfg = plan_gemm(4096, 4096, bm, order=WeightOrder.WPERM, **moe).config
        assert cfg.order is WeightOrder.WPERM and "_wp_" in cfg.name
        assert cfg == dataclasses.replace(plan_gemm(4096, 4096, bm, **moe).config,
                                          order=WeightOrder.WPERM)
    for bm in (8, 16, 128):  # dense: streamed (8), mma.sync (16), WGMMA without kperm (128)
        with pytest.raises(ValueError, match="no kernel reads wperm"):
            plan_gemm(4096, 4096, bm, m_tiles=1, order=WeightOrder.WPERM)
    plans = _warmup.plans_for(_warmup.layers_for_shapes(["v4-flash"]))
    variants = {p.config.name: p.config for p in plans}
    # grouped: a wperm twin of each MoE config; dense: wperm only with wfrag (_wp_wf_); the
    # MXFP4 variants (in the set unless NVFP4_OPS_MXFP4_SCALES=convert) read wperm only
    mx = {n for n, c in variants.items() if getattr(c, "mx", False)}
    assert all(variants[n].order is WeightOrder.WPERM for n in mx)
    wp = [n for n in variants if "_wp_" in n and "_wf_" not in n and n not in mx]
    assert wp and all(variants[n].grouped for n in wp)
    assert all(n.replace("_wp_", "_") in variants for n in wp)
    wf = [n for n in variants if "_wf_" in n]
    assert wf and all("_wp_wf_" in n and not variants[n].grouped for n in wf)
    assert all(n.replace("_wp_wf_", "_") in variants for n in wf)
