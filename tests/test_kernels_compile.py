"""CI: every CuTeDSL kernel variant that ``precompile --shape v4-flash|v4-pro`` can reach
compiles for sm_90a on a CPU-only machine (no driver queries), and exports to an object file."""

from __future__ import annotations

import importlib
import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
pytest.importorskip("cutlass")

from nvfp4_ops.kernels import linear_cuda  # noqa: E402
from nvfp4_ops.kernels.cute import w4a16_gemm  # noqa: E402

VARIANTS = linear_cuda.variants_for_shapes(["v4-flash", "v4-pro"], include_moe=True)


def test_variant_set_covers_every_block_m_and_epilogue():
    names = {c.name for c in VARIANTS}
    # 2 shapes x 4 problems x 6 token tiles, plus the dense WGMMA tiles that depend on the
    # number of m-tiles (block_m 128: 1-2, 256: 2-16; 6 more configs over the two shapes), plus
    # the persistent decode gate/up of each shape (<= PERSIST_MAX_TILES token tiles). Every
    # grouped config reads a permuted order (_kp): the 32-block one at 16-256, the pair order
    # at 8 (the natural grouped 8-token configs are no longer reached); the MoE launches them
    # with pdl (_pdl). Each grouped config also has a twin reading wperm weights (_wp; both
    # V4 shapes have wperm_supported). Each dense config has a twin reading the prepared
    # order of nvfp4::to_wfrag_ (_wp_wf: wfrag + wperm, natural activations)
    dense_plain = 56 - (2 * 2 * 6 + 2)
    assert len(names) == len(VARIANTS) == 56 + 2 * 2 * 6 + 2 + dense_plain
    families = {linear_cuda.config_family(c) for c in VARIANTS}
    assert families == {"w4a16_stream", "w4a16_gemm", "w4a16_wgmma"}
    grouped = [c for c in VARIANTS if c.grouped]
    assert len(grouped) == 2 * (2 * 2 * 6 + 2) and all(c.kperm for c in grouped)
    assert sum(c.wperm for c in grouped) == len(grouped) // 2
    assert not any(getattr(c, "wfrag", False) for c in grouped)
    dense = [c for c in VARIANTS if not c.grouped]
    assert sum(c.wfrag for c in dense) == len(dense) // 2 == dense_plain
    assert all(c.wperm == c.wfrag for c in dense)
    assert {linear_cuda.config_layout(c) for c in dense} == {"natural"}
    assert {linear_cuda.config_layout(c) for c in grouped if c.block_m == 8} == {"pair"}
    assert sum(c.block_m == 8 and "_p396_" in c.name for c in grouped) == 4  # persistent
    assert all(c.pdl for c in grouped)
    for s_name in ("v4-flash", "v4-pro"):
        from nvfp4_ops import get_shape

        s = get_shape(s_name)
        for bm in linear_cuda.BLOCK_MS:
            for n, k, epi, grouped in s.gemm_problems():
                kperm = grouped and linear_cuda.grouped_kperm(s.hidden, s.intermediate, bm)
                for m_tiles in linear_cuda.reach_m_tiles(bm, grouped):
                    orders = ((False, False), (True, False)) if grouped else (
                        (False, False), (True, True))
                    for wperm, wfrag in orders:
                        cfg = linear_cuda.choose_config(n, k, bm, epi, False, grouped,
                                                        m_tiles, kperm, grouped, wperm, wfrag)
                        assert cfg.name in names


@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: c.name)
def test_variant_compiles_for_sm90a(cfg, tmp_path):
    compiled = importlib.import_module(type(cfg).__module__).compile_gemm(cfg)
    path = tmp_path / f"{cfg.name}.o"
    compiled.export_to_c(str(path), function_name=cfg.name)
    assert path.stat().st_size > 1000


def test_linear_test_shapes_compile():
    """The dense shapes the GPU tests and benchmark use (one per token tile class)."""
    for n, k in [(4096, 4096), (7168, 18432), (18432, 7168), (1536, 4096)]:
        for m in (1, 16, 64, 199, 8192):
            cfg = linear_cuda.choose_config(n, k, linear_cuda.block_m_for_tokens(m), "none",
                                            m == 1)
            importlib.import_module(type(cfg).__module__).compile_gemm(cfg)


def test_bad_configs_rejected():
    with pytest.raises(ValueError):
        w4a16_gemm.GemmConfig(4096, 4000)  # K % 128
    with pytest.raises(ValueError):
        w4a16_gemm.GemmConfig(4096, 4096, block_m=24)
    with pytest.raises(ValueError):
        w4a16_gemm.GemmConfig(4096, 4096, epilogue="swiglu", has_bias=True)


def test_dispatch_families_and_fallbacks():
    """Which family serves which tile, and the mma.sync fallback for shapes WGMMA refuses."""

    family = linear_cuda.config_family

    assert family(linear_cuda.choose_config(7168, 18432, 8)) == "w4a16_stream"
    assert family(linear_cuda.choose_config(7168, 18432, 16)) == "w4a16_gemm"
    assert family(linear_cuda.choose_config(4096, 4096, 16, "swiglu", grouped=True)) == \
        "w4a16_wgmma"
    assert family(linear_cuda.choose_config(7168, 18432, 256)) == "w4a16_wgmma"
    # N_out = 80: not a multiple of 64 -> dense falls back to mma.sync's largest tile
    cfg = linear_cuda.choose_config(80, 1024, 128)
    assert family(cfg) == "w4a16_gemm" and cfg.block_m == 64
    # ... but a grouped tile cannot change (the routing padded to it): refused up front
    assert not linear_cuda.grouped_supported(80, 1024, 128)
    assert linear_cuda.grouped_supported(80, 1024, 16)  # mma.sync has 16-row tiles
    with pytest.raises(ValueError, match="no kernel covers grouped"):
        linear_cuda.choose_config(80, 1024, 128, grouped=True)
    # K % 256 != 0: the streamed kernel refuses, mma.sync takes the 8-token tile
    assert family(linear_cuda.choose_config(4096, 1152, 8)) == "w4a16_gemm"
    assert [linear_cuda.block_m_for_tokens(m) for m in (1, 9, 17, 33, 65, 256, 257, 512)] == \
        [8, 16, 32, 64, 128, 128, 256, 256]
    # permuted activations: the MoE's WGMMA tiles (32-block order) and streamed 8-token tiles
    # (pair order); the order each tile's config reads is the one the gather writes
    assert linear_cuda.choose_config(4096, 4096, 64, "swiglu", False, True, None, True).kperm
    for bm in linear_cuda.BLOCK_MS:
        for n, k, epi in ((4096, 4096, "swiglu"), (4096, 2048, "row_scale")):
            for m_tiles in (None, 1, 9):
                cfg = linear_cuda.choose_config(n, k, bm, epi, False, True, m_tiles, True)
                assert cfg.kperm and cfg.grouped and cfg.block_m == bm
                want = "pair" if bm == 8 else "kperm"
                assert linear_cuda.config_layout(cfg) == want == linear_cuda.grouped_layout(bm)
                assert family(cfg) == ("w4a16_stream" if bm == 8 else "w4a16_wgmma")
                assert linear_cuda.config_layout(
                    linear_cuda.choose_config(n, k, bm, epi, False, True, m_tiles)) == "natural"
    # the pair-order decode gate/up keeps the persistent choice at few token tiles
    assert linear_cuda.choose_config(4096, 4096, 8, "swiglu", False, True, 6, True).ctas > 0
    assert linear_cuda.choose_config(4096, 4096, 8, "swiglu", False, True, 9, True).ctas == 0
    assert [linear_cuda.grouped_kperm(4096, 2048, bm) for bm in linear_cuda.BLOCK_MS] == \
        [True] * 6
    assert linear_cuda.grouped_kperm(7168, 3072, 8)  # V4-Pro
    # tiny (H=256, I=128): the down GEMM (K = 128) is not streamed at 8 -> natural there
    assert [linear_cuda.grouped_kperm(256, 128, bm) for bm in linear_cuda.BLOCK_MS] == \
        [False] + [True] * 5
    for kw in (dict(block_m=8, grouped=False), dict(block_m=128, grouped=False),
               dict(block_m=8, grouped=True, k=1152)):  # K % 256: mma.sync fallback
        kw.setdefault("k", 4096)
        with pytest.raises(ValueError, match="k-permuted"):
            linear_cuda.choose_config(4096, epilogue="swiglu", kperm=True, **kw)


def test_moe_op_tile_is_the_ops_choice():
    """``moe_cuda.op_tile`` (what benchmarks and tests take as the op's tile): the covered
    ``choose_block_m`` tile and its family's permuted order (pair at 8, kperm from 16)."""
    from nvfp4_ops.kernels import moe_cuda

    flash = [moe_cuda.op_tile(t, 6, 256, 4096, 2048) for t in (1, 128, 512, 4096, 16384)]
    assert flash == [(8, True), (8, True), (16, True), (128, True), (256, True)]
    for t in (1, 100, 5000):
        bm = moe_cuda.choose_block_m(t * 6, 64)
        assert moe_cuda.op_tile(t, 6, 64, 256, 128) == (
            bm, linear_cuda.grouped_kperm(256, 128, bm))
    assert moe_cuda.op_tile(3, 6, 64, 256, 128) == (8, False)  # tiny: K = 128 not streamed
