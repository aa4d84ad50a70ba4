"""The ``wperm`` bit order (EXPERIMENT, :mod:`nvfp4_ops.kernels.wperm`): the permutation, the
decoder's integer part against ``pair4``'s, and the kernels that read it compile for sm_90a
with fewer decode instructions."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from nvfp4_ops.kernels import wperm as W


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


def _ptx(compile_gemm, cfg, out):
    out.mkdir()
    compile_gemm(cfg, extra_options=f" --keep-ptx --dump-dir {out}")
    (ptx,) = list(out.glob("*.ptx"))
    return ptx.read_text()


@pytest.mark.parametrize("family", ["stream", "wgmma"])
def test_wperm_kernels_compile(family, tmp_path):
    """The streamed (dense and MoE) and WGMMA (MoE ``kperm``) kernels with ``wperm`` compile
    for sm_90a; per decoded word the PTX has 13 shift / logic ops instead of 20 (ptxas fuses
    and/or pairs into LOP3: 11 SASS instructions instead of 16), and the same MMAs."""
    pytest.importorskip("cutlass")
    if family == "stream":
        from nvfp4_ops.kernels.cute import w4a16_stream as mod
        base = mod.choose_config(7168, 18432, 8, "none", False, False)
        mma = "mma.sync"
    else:
        from nvfp4_ops.kernels.cute import w4a16_wgmma as mod
        base = mod.choose_config(4096, 4096, 16, "swiglu", False, True, kperm=True)
        mma = "wgmma.mma_async"
    counts = {}
    for wp in (False, True):
        cfg = dataclasses.replace(base, wperm=wp)
        assert cfg.name.endswith("_wp_sm_90a") == wp
        text = _ptx(mod.compile_gemm, cfg, tmp_path / str(wp))
        counts[wp] = {op: text.count(op) for op in
                      ("shl.b32", "shr.u32", "shr.b32", "and.b32", "or.b32", "mul.rn.bf16x2", mma)}
    words = counts[False]["mul.rn.bf16x2"] // 4
    assert words > 0 and counts[True]["mul.rn.bf16x2"] == 4 * words
    assert counts[True][mma] == counts[False][mma] > 0

    def int_ops(c):
        return sum(c[op] for op in ("shl.b32", "shr.u32", "shr.b32", "and.b32", "or.b32"))

    # the rest of the kernel's integer ops are the same in both builds
    assert int_ops(counts[False]) - int_ops(counts[True]) == (20 - 13) * words


def test_wgmma_wperm_needs_kperm():
    pytest.importorskip("cutlass")
    from nvfp4_ops.kernels.cute import w4a16_wgmma as mod
    base = mod.choose_config(4096, 4096, 16, "swiglu", False, True, kperm=False)
    with pytest.raises(ValueError, match="wperm needs kperm"):
        dataclasses.replace(base, wperm=True)
