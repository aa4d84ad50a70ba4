"""The ``wfrag`` weight order (:mod:`nvfp4_ops.orders.wfrag`): the permutation,
what the kernels compute from it (emulated in torch), the three dense kernel families with it
compile for sm_90a, and (GPU) equal the checkpoint-order kernels up to fp32 summation order."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from nvfp4_ops.format import e2m1_to_float, unpack_e2m1
from nvfp4_ops.orders import kperm
from nvfp4_ops.orders import wfrag as F
from nvfp4_ops.orders import wperm as W
from nvfp4_ops.testing import kernel_ptx


def _words(w: torch.Tensor) -> torch.Tensor:
    return w.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def test_source_is_the_inverse_kperm_permutation():
    src = [F.source(q) for q in range(F.BLOCK_K)]
    assert sorted(src) == list(range(F.BLOCK_K))
    assert src == [kperm.dst(q) for q in range(F.BLOCK_K)]


def test_round_trip_and_errors():
    w = torch.randint(0, 256, (3, 5, 64), dtype=torch.uint8)
    p = F.to_wfrag(w)
    assert p.shape == w.shape and p.dtype == torch.uint8 and not torch.equal(p, w)
    assert torch.equal(F.from_wfrag(p), w)
    with pytest.raises(ValueError, match="multiple of 32"):
        F.to_wfrag(torch.zeros(4, 24, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        F.to_wfrag(torch.zeros(4, 32, dtype=torch.int32))


def test_pair4_registers_are_natural_pairs():
    """``pair4`` on word ``c`` of a ``wfrag`` block gives register ``j`` = the checkpoint codes
    at k ``8 j + 2 c`` (low half) and ``8 j + 2 c + 1`` (high half): the MMA fragment slots of
    natural-order activations. The ``wperm`` decoder on ``to_wperm(to_wfrag(w))`` gives the
    same registers."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randint(0, 256, (8, 64), dtype=torch.uint8, generator=gen)  # K = 128
    p = F.to_wfrag(w)
    regs = W.emulate_pair4(_words(p))  # [4, rows, words]
    assert torch.equal(W.emulate_wperm(_words(W.to_wperm(p))), regs)
    codes = unpack_e2m1(w).long()  # [rows, K]
    want_val = e2m1_to_float(codes)
    for word in range(regs.shape[2]):
        block, c = divmod(word, 4)
        for j in range(4):
            for half in range(2):
                k = 32 * block + 8 * j + 2 * c + half
                bits = ((regs[j, :, word] >> (16 * half)) & 0xFFFF).to(torch.int32)
                got = bits.to(torch.int16).view(torch.bfloat16).float() * 2.0**126
                assert torch.equal(got, want_val[:, k]), (word, j, half)


def test_lane_emulation_is_the_natural_dot_product():
    gen = torch.Generator().manual_seed(2)
    n, k, m = 24, 256, 5
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    x = torch.randn(m, k, generator=gen, dtype=torch.float64)
    got = F.emulate_lane_dot(F.to_wfrag(w), x)
    want = e2m1_to_float(unpack_e2m1(w)).double() @ x.T
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # and the checkpoint order read as wfrag is a different product (the test can fail)
    assert not torch.allclose(F.emulate_lane_dot(w, x), want)


os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def _plan(n, k, bm, epilogue="none", has_bias=False, grouped=False, m_tiles=None,
          kperm=False, wfrag=False):
    """The dispatch's config (``wfrag``: on prepared weights, wfrag + wperm)."""
    from nvfp4_ops.kernels.dispatch import WeightOrder, plan_gemm

    order = WeightOrder.WFRAG if wfrag else WeightOrder.CHECKPOINT
    return plan_gemm(n, k, bm, epilogue=epilogue, has_bias=has_bias, grouped=grouped,
                     m_tiles=m_tiles, permuted=kperm, order=order).config


def _family(cfg) -> str:
    from nvfp4_ops.kernels.dispatch import plan_of_config

    return plan_of_config(cfg).family


def _family_configs():
    return {
        "stream": (_plan(7168, 18432, 8), "mma.sync"),
        "mma.sync": (_plan(7168, 18432, 16), "mma.sync"),
        "wgmma": (_plan(7168, 18432, 128, m_tiles=1), "wgmma.mma_async"),
    }


@pytest.mark.parametrize("family", ["stream", "mma.sync", "wgmma"])
def test_wfrag_kernels_compile(family, tmp_path):
    """Each dense family compiles on WFRAG weights (fragment order + ``wperm`` bits) for
    sm_90a, with the same MMAs as the checkpoint-order build, two scales per decoded word and
    (streamed and ``mma.sync``: the activation pairs need no ``prmt`` any more) fewer
    ``prmt``."""
    pytest.importorskip("cutlass")
    from nvfp4_ops.orders import WeightOrder

    base, mma = _family_configs()[family]
    counts = {}
    for name, order in (("natural", WeightOrder.CHECKPOINT), ("wpwf", WeightOrder.WFRAG)):
        cfg = dataclasses.replace(base, order=order)
        assert ("_wp_wf_" in cfg.name) == (name != "natural")
        text = kernel_ptx(cfg, tmp_path / name)
        counts[name] = {op: text.count(op) for op in (mma, "prmt.b32", "mul.rn.bf16x2")}
    assert counts["wpwf"][mma] == counts["natural"][mma] > 0
    assert counts["wpwf"]["mul.rn.bf16x2"] > 0
    if family != "wgmma":
        assert counts["wpwf"]["prmt.b32"] < counts["natural"]["prmt.b32"]


def test_wfrag_config_errors():
    pytest.importorskip("cutlass")
    from nvfp4_ops.orders import WeightOrder

    g = _plan(7168, 18432, 16)
    with pytest.raises(ValueError, match="WPERM order is read by mma.sync only"):
        dataclasses.replace(g, order=WeightOrder.WPERM)
    s = _plan(4096, 4096, 8, "swiglu", grouped=True, kperm=True)
    with pytest.raises(ValueError, match="excludes"):
        dataclasses.replace(s, order=WeightOrder.WFRAG)
    wg = _plan(4096, 4096, 16, "swiglu", grouped=True, kperm=True)
    with pytest.raises(ValueError, match="excludes"):
        dataclasses.replace(wg, order=WeightOrder.WFRAG)


# --- GPU: each family on wfrag weights vs the checkpoint-order kernel --------------------

CASES = [  # (family, M): the tiles linear's dispatch uses, plus WGMMA's one-warpgroup bm16/32
    ("stream", 1), ("stream", 7), ("mma.sync", 16), ("mma.sync", 29), ("wgmma", 64),
    ("wgmma", 199), ("wgmma", 1024), ("wgmma_r1", 16), ("wgmma_r1", 32),
]


NKS = [(7168, 18432), (18432, 7168), (4096, 4096)]


def _base_config(family: str, n: int, k: int, m: int):
    from nvfp4_ops.kernels.cute import w4a16_wgmma
    from nvfp4_ops.kernels.dispatch import dense_block_m, plan_linear

    if family == "wgmma_r1":
        return w4a16_wgmma.WgmmaConfig(n, k, "none", False, False, dense_block_m(m), 1, 1, 4)
    return plan_linear(n, k, m).config


def _pair(base):
    """``base`` (checkpoint order) and the same config on WFRAG weights."""
    from nvfp4_ops.orders import WeightOrder

    return base, dataclasses.replace(base, order=WeightOrder.WFRAG)


@pytest.fixture(scope="module")
def compiled_cases():
    """Compile the GPU cases' 81 configs first in parallel worker processes (into the disk
    cache), instead of one after another inside the tests."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from nvfp4_ops import _compile
    from nvfp4_ops.cli.precompile import compile_configs

    if _compile.cache_dir() is not None:
        compile_configs([c for fam, m in CASES for n, k in NKS
                         for c in _pair(_base_config(fam, n, k, m))],
                        max(1, min(8, (os.cpu_count() or 2) // 2)), "test precompile")


@pytest.mark.gpu
@pytest.mark.parametrize("nk", NKS)
@pytest.mark.parametrize("family,m", CASES)
def test_wfrag_matches_checkpoint_order_on_gpu(family, m, nk, compiled_cases):
    """Same config on WFRAG weights (fragment order + ``wperm`` bits) vs the checkpoint-order
    kernel: within fp32-order noise of each other (max abs diff <= 1e-2 of the output's max),
    every row written (NaN-poisoned outputs)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels.dispatch import plan_of_config

    n, k = nk
    gen = torch.Generator(device="cuda").manual_seed(n + m)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    ws = (torch.rand(n, k // 16, device="cuda", generator=gen) * 3 + 2.0**-9).to(
        torch.float8_e4m3fn)
    wg = torch.rand(n, device="cuda", generator=gen) * 0.01 + 1e-3
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    gv = L.per_row_global_view(wg, n)
    base = _base_config(family, n, k, m)
    assert _family(base) == {"stream": "stream", "mma.sync": "mma"}.get(family, "wgmma")
    w_fp = W.to_wperm(F.to_wfrag(w))
    outs = []
    for cfg, wt in zip(_pair(base), (w, w_fp), strict=True):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        L.run_gemm(plan_of_config(cfg), x, wt, ws, gv, out)
        outs.append(out)
    ref, got = (o.float() for o in outs)
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max() <= 1e-2 * ref.abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("nk,m", [((7168, 18432), 1), ((7168, 18432), 7), ((18432, 7168), 1),
                                  ((4096, 4096), 3)])
def test_stream_tma2d_bitwise_on_gpu(nk, m):
    """The streamed kernel with ``tma2d`` (two TMA tensor copies per stage, column-grouped
    stage layout) on prepared weights: bitwise equal to the same config without it (the same
    MMAs in the same order), every element written (NaN-poisoned outputs)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels.dispatch import plan_of_config

    n, k = nk
    gen = torch.Generator(device="cuda").manual_seed(n + 3 * m)
    w = W.to_wperm(F.to_wfrag(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8,
                                            device="cuda", generator=gen)))
    ws = (torch.rand(n, k // 16, device="cuda", generator=gen) * 3 + 2.0**-9).to(
        torch.float8_e4m3fn)
    gv = L.per_row_global_view(torch.rand(n, device="cuda", generator=gen) + 0.5, n)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    base = dataclasses.replace(_plan(n, k, 8, m_tiles=1, wfrag=True), tma2d=False)
    outs = []
    for cfg in (base, dataclasses.replace(base, tma2d=True)):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        L.run_gemm(plan_of_config(cfg), x, w, ws, gv, out)
        outs.append(out)
    assert torch.isfinite(outs[0]).all()
    assert torch.equal(outs[0], outs[1])


# --- the prepared order through the ops (CPU: the references undo it exactly) -------------


def test_to_wfrag_op_in_place_and_checked():
    import nvfp4_ops
    from nvfp4_ops import NVFP4InputError

    w = torch.randint(0, 256, (6, 64), dtype=torch.uint8)
    before, ptr = w.clone(), w.data_ptr()
    assert nvfp4_ops.to_wfrag_(w) is w and w.data_ptr() == ptr
    assert torch.equal(w, W.to_wperm(F.to_wfrag(before)))
    assert torch.equal(F.unprepared(w), before)
    nvfp4_ops.to_wfrag_(w, inverse=True)
    assert torch.equal(w, before)
    torch.library.opcheck(torch.ops.nvfp4.to_wfrag_.default, (w.clone(), False))
    with pytest.raises(NVFP4InputError, match="multiple of 32"):
        nvfp4_ops.to_wfrag_(torch.zeros(4, 24, dtype=torch.uint8))
    with pytest.raises(NVFP4InputError, match="contiguous"):
        nvfp4_ops.to_wfrag_(torch.zeros(64, 4, dtype=torch.uint8).t())


def test_linear_and_mlp_with_prepared_weights_are_exact_on_cpu():
    """``wfrag=True`` on prepared weights = ``wfrag=False`` on the checkpoint bytes, bitwise
    (the reference undoes the order); ``wfrag=True`` on unprepared bytes is a different answer
    (the flag is read); the op traces under ``torch.compile`` with it."""
    import nvfp4_ops
    from nvfp4_ops.format import quantize as quantize_nvfp4

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 128, generator=gen).to(torch.bfloat16)
    w, ws, wg = quantize_nvfp4(torch.randn(96, 128, generator=gen))
    prepared = nvfp4_ops.to_wfrag_(w.clone())
    want = nvfp4_ops.linear(x, w, ws, wg)
    assert torch.equal(nvfp4_ops.linear(x, prepared, ws, wg, wfrag=True), want)
    assert not torch.equal(nvfp4_ops.linear(x, w, ws, wg, wfrag=True), want)
    compiled = torch.compile(lambda a: nvfp4_ops.linear(a, prepared, ws, wg, wfrag=True),
                             fullgraph=True)
    assert torch.equal(compiled(x), want)
    torch.library.opcheck(torch.ops.nvfp4.linear.default,
                          (x, prepared, ws.view(torch.uint8), wg, None, True))

    h, i = 128, 64
    w13, s13, _ = quantize_nvfp4(torch.randn(2 * i, h, generator=gen))
    w2, s2, g2 = quantize_nvfp4(torch.randn(h, i, generator=gen))
    g13 = torch.tensor([0.002, 0.003])
    want = nvfp4_ops.mlp(x, w13, s13, g13, w2, s2, g2, 7.0)
    got = nvfp4_ops.mlp(x, nvfp4_ops.to_wfrag_(w13.clone()), s13, g13,
                        nvfp4_ops.to_wfrag_(w2.clone()), s2, g2, 7.0, wfrag=True)
    assert torch.equal(got, want)


def test_dense_variants_include_the_prepared_order():
    """``precompile`` / ``warmup`` reach the ``wfrag`` + ``wperm`` twin of every dense config
    (the glue prepares dense weights on CUDA), and no grouped (MoE) config takes wfrag."""
    from nvfp4_ops import _warmup

    variants = [p.config for p in _warmup.plans_for(_warmup.layers_for_shapes(["v4-flash"]))]
    dense = [c for c in variants if not c.grouped]
    plain = {c.name for c in dense if not c.order.fragment_order}
    twins = {c.name for c in dense if c.order.fragment_order}
    assert plain and len(twins) == len(plain)
    assert all(c.order.wperm_bits for c in dense if c.order.fragment_order)
    assert not any(c.order.fragment_order for c in variants if c.grouped)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 128, 1024])
def test_ops_with_prepared_weights_on_gpu(m):
    """``nvfp4.linear`` / ``nvfp4.mlp`` with ``wfrag=True`` on prepared weights vs the
    checkpoint order: within fp32-order noise; a CUDA graph of the prepared linear replays
    bitwise equal to eager with new inputs."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import nvfp4_ops
    from nvfp4_ops.format import quantize as quantize_nvfp4

    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 7168, device="cuda", generator=gen).to(torch.bfloat16)
    w, ws, wg = quantize_nvfp4(torch.randn(4096, 7168, device="cuda", generator=gen))
    prepared = nvfp4_ops.to_wfrag_(w.clone())
    want = nvfp4_ops.linear(x, w, ws, wg).float()
    got = nvfp4_ops.linear(x, prepared, ws, wg, wfrag=True).float()
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= 1e-2 * want.abs().max()

    h, i = 4096, 2048
    w13, s13, _ = quantize_nvfp4(torch.randn(2 * i, h, device="cuda", generator=gen))
    w2, s2, g2 = quantize_nvfp4(torch.randn(h, i, device="cuda", generator=gen))
    g13 = torch.tensor([0.002, 0.003], device="cuda")
    xh = x[:, :h].contiguous()
    want = nvfp4_ops.mlp(xh, w13, s13, g13, w2, s2, g2, 7.0).float()
    got = nvfp4_ops.mlp(xh, nvfp4_ops.to_wfrag_(w13.clone()), s13, g13,
                        nvfp4_ops.to_wfrag_(w2.clone()), s2, g2, 7.0, wfrag=True).float()
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()

    static_x = x.clone()
    nvfp4_ops.linear(static_x, prepared, ws, wg, wfrag=True)  # compiled and run before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = nvfp4_ops.linear(static_x, prepared, ws, wg, wfrag=True)
    for seed in range(3):
        new_x = torch.randn(m, 7168, device="cuda",
                            generator=torch.Generator(device="cuda").manual_seed(seed))
        static_x.copy_(new_x.to(torch.bfloat16))
        graph.replay()
        assert torch.equal(static_y, nvfp4_ops.linear(static_x, prepared, ws, wg, wfrag=True))


def test_wfrag_dispatch_stream_tma2d():
    """Dense 8-token tiles on wfrag weights fill their stages with TMA tensor copies
    (``tma2d``), bias or not, where each CTA streams >= 16 K chunks or the CTAs fit one per SM;
    other widths, checkpoint-order weights, the MLP's SwiGLU and grouped (MoE) tiles keep the
    per-row bulk copies."""
    pytest.importorskip("cutlass")
    for (n, k), want in ((7168, 18432), True), ((1536, 4096), True), ((2112, 4096), True), \
                        ((18432, 7168), False), ((4096, 4096), False), ((2128, 4096), False):
        for bias in (False, True):
            cfg = _plan(n, k, 8, has_bias=bias, m_tiles=1, wfrag=True)
            assert _family(cfg) == "stream" and cfg.order.fragment_order
            assert cfg.tma2d == want, (n, k, bias)
        assert not _plan(n, k, 8, m_tiles=1).tma2d
    assert not _plan(7168, 18432, 8, "swiglu", m_tiles=1, wfrag=True).tma2d


def test_wfrag_dispatch_small_tiles_by_width():
    """Dense 16 / 32-token tiles on wfrag weights: the stream-K WGMMA tile where every CTA gets
    >= 64 k tiles of 64 (bias allowed; 3 CTAs per SM; 4 stages of 128 k), else the
    one-warpgroup 6-stage tile once its 64-row blocks fill two waves of SMs (N >= 16896),
    ``mma.sync`` below that or on checkpoint-order weights. 128-token tiles: stream-K with two
    row warpgroups up to two token tiles (K % 128 != 0 never gets here: the op runs the
    reference)."""
    pytest.importorskip("cutlass")
    from nvfp4_ops.kernels.dispatch import WeightOrder, plan_linear

    def tile(cfg):
        assert type(cfg).__name__ == "WgmmaConfig" and cfg.order.fragment_order
        return cfg.block_m, cfg.row_wgs, cfg.split_k, cfg.stages, cfg.streamk, cfg.stage_k

    for bm in (16, 32):
        for n, k in ((18432, 7168), (7168, 18432)):
            for bias in (False, True):
                cfg = _plan(n, k, bm, has_bias=bias, m_tiles=1, wfrag=True)
                assert tile(cfg) == (bm, 1, 1, 4, 3, 128) and cfg.has_bias == bias
        # too little K per CTA for stream-K: the wide tile, or mma.sync when narrow too
        wide = _plan(18432, 1024, bm, m_tiles=1, wfrag=True)
        assert tile(wide) == (bm, 1, 1, 6, 0, 64)
        for args, wfrag in (((4096, 4096, bm, "none", False), True),
                            ((18432, 1024, bm, "none", True), True),
                            ((18432, 7168, bm, "none", False), False)):
            cfg = _plan(*args[:3], has_bias=args[4], m_tiles=1, wfrag=wfrag)
            assert type(cfg).__name__ == "GemmConfig" and cfg.order.fragment_order == wfrag
    for n, k in ((18432, 7168), (7168, 18432)):
        for m_tiles in (1, 2):
            cfg = _plan(n, k, 128, m_tiles=m_tiles, wfrag=True)
            assert tile(cfg) == (128, 2, 1, 4, 1, 128)
        assert _plan(n, k, 128, m_tiles=3, wfrag=True).streamk == 0
        assert _plan(n, k, 128, m_tiles=1).streamk == 0
    assert plan_linear(18432, 7232, 128, order=WeightOrder.WFRAG) is None  # K % 128: reference
    assert _plan(4096, 4096, 128, m_tiles=1, wfrag=True).streamk == 0
    assert _plan(18432, 7168, 128, "swiglu", m_tiles=1, wfrag=True).streamk == 0


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 29])
def test_linear_wide_small_m_on_gpu(m, compiled_cases):
    """``nvfp4.linear`` at (18432, 7168) and 16 / 29 tokens on prepared weights (the dispatch's
    one-warpgroup WGMMA tile) vs the checkpoint order (``mma.sync``): within fp32-order noise,
    every element written."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import nvfp4_ops
    from nvfp4_ops.format import quantize as quantize_nvfp4

    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 7168, device="cuda", generator=gen).to(torch.bfloat16)
    w, ws, wg = quantize_nvfp4(torch.randn(18432, 7168, device="cuda", generator=gen))
    want = nvfp4_ops.linear(x, w, ws, wg).float()
    got = nvfp4_ops.linear(x, nvfp4_ops.to_wfrag_(w.clone()), ws, wg, wfrag=True).float()
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= 1e-2 * want.abs().max()
