"""CI (CPU only): every WGMMA W4A16 variant that ``w4a16_wgmma.choose_config`` returns for the
dense linear shapes and the V4-Flash / V4-Pro MoE + shared-expert shapes, for every token tile
(and, dense, every number of m-tiles), compiles for sm_90a without a GPU and exports to an
object file (what the disk cache stores); plus the pure-Python rules (register split, shared
memory floor, the dense tile choice, refused tiles)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
pytest.importorskip("cutlass")

from nvfp4_ops.kernels.cute import w4a16_wgmma  # noqa: E402
from nvfp4_ops.shapes import get_shape  # noqa: E402
from nvfp4_ops.testing import kernel_ptx  # noqa: E402

#: (N, K, epilogue, grouped): the dense linears of the acceptance issues, then per model the
#: shared-expert MLP (gate/up + SwiGLU, down) and the routed experts' grouped GEMMs.
PROBLEMS = [(7168, 18432, "none", False), (18432, 7168, "none", False),
            (4096, 4096, "none", False)]
for _name in ("v4-flash", "v4-pro"):
    PROBLEMS += get_shape(_name).gemm_problems()


def _variants():
    seen = {}
    for n, k, epi, grouped in PROBLEMS:
        n_out = n // 2 if epi == "swiglu" else n
        assert w4a16_wgmma.supported(n_out, k), (n, k, epi)
        for bm in w4a16_wgmma.BLOCK_MS:
            # grouped: one config per tile; dense: one per number of m-tiles too (every value
            # choose_config distinguishes, a superset of what a dispatch can pass)
            for m_tiles in [None] if grouped else range(1, w4a16_wgmma.MAX_M_TILES + 1):
                cfg = w4a16_wgmma.choose_config(n, k, bm, epi, False, grouped, m_tiles)
                seen.setdefault(cfg.name, cfg)
    # one bias variant (the dense linear with bias)
    cfg = w4a16_wgmma.choose_config(4096, 4096, 128, "none", True, False)
    seen.setdefault(cfg.name, cfg)
    return list(seen.values())


VARIANTS = _variants()


def test_config_names_are_unique_keys():
    assert len({c.name for c in VARIANTS}) == len(VARIANTS)
    for c in VARIANTS:
        assert c.name.startswith("w4a16wg_") and c.name.isidentifier()
        assert c.n_out % c.features_per_cta == 0 and c.num_stages >= 2


def test_unvalidated_configs_are_refused():
    with pytest.raises(ValueError, match="not validated"):
        w4a16_wgmma.WgmmaConfig(4096, 4096, "none", block_m=64, row_wgs=1, split_k=4)
    with pytest.raises(ValueError, match="not validated"):  # grouped split-K: never run
        w4a16_wgmma.WgmmaConfig(4096, 4096, "none", grouped=True, block_m=128, row_wgs=1,
                                split_k=2)
    with pytest.raises(ValueError, match="block_m"):
        w4a16_wgmma.WgmmaConfig(4096, 4096, "none", block_m=48)
    # the GPU-verified ones are accepted
    for bm, r, sk in w4a16_wgmma.VERIFIED_MULTI:
        w4a16_wgmma.WgmmaConfig(18432, 7168, "none", block_m=bm, row_wgs=r, split_k=sk)
    # three row warpgroups: dense, no split-K, at most 128 tokens (register budget)
    for kw in (dict(grouped=True), dict(split_k=2), dict(block_m=256)):
        with pytest.raises(ValueError, match="row_wgs=3"):
            w4a16_wgmma.WgmmaConfig(18432, 7168, "none", **{"block_m": 128, "row_wgs": 3,
                                                            "allow_unverified": True, **kw})


def test_register_split_fits_the_launch_allocation():
    """setmaxnreg moves registers inside the CTA's launch allocation (65536 / threads, rounded
    down to 8, per lane): asking for more blocks setmaxnreg.inc forever (the 640-thread hang)."""
    for bm, r, sk in [(128, 2, 1), (256, 2, 1), (128, 1, 2), (128, 1, 4), (128, 2, 2),
                      (128, 4, 1), (128, 3, 1)]:
        cfg = w4a16_wgmma.WgmmaConfig(18432, 7168, "none", block_m=bm, row_wgs=r, split_k=sk)
        kern = w4a16_wgmma.W4A16WgmmaGemm(cfg)
        assert cfg.uses_setmaxnreg
        used = 128 * kern.producer_regs + 128 * cfg.consumers * kern.consumer_regs
        assert used <= kern.entry_regs * kern.threads, cfg.name
        assert kern.consumer_regs % 8 == 0 and kern.consumer_regs >= 112, cfg.name
    assert w4a16_wgmma.W4A16WgmmaGemm(
        w4a16_wgmma.WgmmaConfig(4096, 4096, block_m=128, row_wgs=2)).consumer_regs == 232


def test_small_tiles_have_no_smem_floor():
    """block_m 16-64: no setmaxnreg, so no 116 KiB floor (2-3 CTAs per SM fit); grouped 16 /
    32 take one row warpgroup and a 3-5 stage ring (choose_config, H200 sweeps of sessions 5
    and 7)."""
    for bm in (16, 32, 64):
        cfg = w4a16_wgmma.choose_config(4096, 4096, bm, "swiglu", grouped=True)
        small = w4a16_wgmma.GROUPED_SMALL_TILES.get((bm, "swiglu"))
        assert cfg.consumers == (1 if small else 2)
        assert cfg.num_stages == (small or 8)
        assert not cfg.uses_setmaxnreg
        assert w4a16_wgmma.W4A16WgmmaGemm(cfg).smem_bytes(50176) == 50176
    cfg = w4a16_wgmma.choose_config(4096, 4096, 128, "swiglu", grouped=True)
    assert cfg.uses_setmaxnreg
    assert w4a16_wgmma.W4A16WgmmaGemm(cfg).smem_bytes(50176) == 116 * 1024


def test_dense_choice_follows_the_h200_sweep():
    """The wave estimate picks the measured best (or within 8%) tiles of the H200 sweep
    (benchmarks/results/h200_2026-11-30_s3/wgmma_sweep_h200.txt)."""
    def tile(n, k, bm, m_tiles):
        cfg = w4a16_wgmma.choose_config(n, k, bm, m_tiles=m_tiles)
        return cfg.row_wgs, cfg.split_k

    assert tile(7168, 18432, 128, 1) == (1, 2)  # M=128: 83.4 us (bf16 74.2)
    # (18432, 7168): three row warpgroups (session 8, h200_2026-12-01_s8/ab/r3.log, wfrag
    # weights): M=128 75.1 us vs r4 s1 95.6; M=199 143.7 vs r2 s2 149.8
    assert tile(18432, 7168, 128, 1) == (3, 1)
    assert tile(7168, 18432, 128, 2) == (2, 2)  # M=199: 135.7 us
    assert tile(18432, 7168, 128, 2) == (3, 1)
    # r3 only without epilogue or bias (what the H200 runs validated)
    assert w4a16_wgmma.choose_config(18432, 7168, 128, has_bias=True, m_tiles=1).row_wgs != 3
    assert w4a16_wgmma.choose_config(36864, 7168, 128, "swiglu", m_tiles=1).row_wgs != 3
    assert tile(4096, 4096, 256, 2) == (1, 2)  # M=512: 27.9 us vs 45.4 for r2 s1
    assert tile(7168, 18432, 256, 2) == (2, 1)  # M=512: 203.9 us
    for n, k in [(4096, 4096), (7168, 18432), (18432, 7168)]:
        assert tile(n, k, 256, 4) == (2, 1)  # M=1024: r2 s1 fastest on all three
        # grouped and "no m_tiles" keep the one-config-per-tile rule
        assert tile(n, k, 128, None) == (2, 1)


@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: c.name)
def test_variant_compiles_for_sm90a(cfg, tmp_path):
    compiled = w4a16_wgmma.compile_gemm(cfg)
    path = tmp_path / f"{cfg.name}.o"
    compiled.export_to_c(str(path), function_name=cfg.name)
    assert path.stat().st_size > 0


@pytest.mark.parametrize("block_m", [16, 128])
def test_launch_overlap_waits(block_m, tmp_path):
    """``pdl`` (grouped only): the producer waits for the previous grid after the first stages'
    weight boxes, the consumers before the pipeline (then thread 0 lets the next grid launch),
    and a skipped CTA 0 waits: three waits, one trigger; none without ``pdl``."""
    counts = {}
    for pdl in (False, True):
        cfg = w4a16_wgmma.choose_config(4096, 4096, block_m, "swiglu", grouped=True, kperm=True,
                                        pdl=pdl)
        assert cfg.pdl == pdl and cfg.name.endswith("_pdl_sm_90a") == pdl
        text = kernel_ptx(cfg, tmp_path / str(pdl))
        counts[pdl] = [text.count(f"griddepcontrol.{op};") for op in ("wait", "launch_dependents")]
    assert counts == {False: [0, 0], True: [3, 1]}
    with pytest.raises(ValueError):
        w4a16_wgmma.WgmmaConfig(4096, 4096, "none", block_m=128, pdl=True)  # dense: no


def test_nodecode_diagnostic_keeps_the_wgmmas_and_drops_the_decode(tmp_path):
    """``decode=False`` (diagnostics, ``dev_ab_wfrag``): the same WGMMAs and ring, no block-scale
    loads and no decode; refused off the wfrag path; the shipped tile is unchanged by the
    flag's existence (its own name and PTX)."""
    import dataclasses

    from nvfp4_ops.kernels import linear_cuda as L

    shipped = L.linear_config(7168, 18432, 16, wfrag=True)
    assert shipped.stage_k == 128
    # the shipped 128-k-stage tile (a 4-byte scale load per lane and stage from the stage; the
    # weight words are 4-byte shared loads too) and the 64-k one (scales from global memory)
    for name, fields, loads, gone in (
            ("k128", {}, "ld.shared.b32", False),
            ("k64", dict(stage_k=64, stages=6, scale_ahead=False), "ld.global.nc", True)):
        tile = dataclasses.replace(shipped, **fields)
        diag = dataclasses.replace(tile, decode=False)
        assert "_nodec" in diag.name and diag.name.replace("_nodec", "") == tile.name
        texts = {kind: kernel_ptx(cfg, tmp_path / f"{kind}_{name}")
                 for kind, cfg in (("tile", tile), ("diag", diag))}
        assert (texts["diag"].count("wgmma.mma_async") == texts["tile"].count("wgmma.mma_async")
                > 0)
        assert texts["tile"].count(loads) > texts["diag"].count(loads), name
        assert texts["diag"].count(loads) == 0 or not gone, name
        assert len(texts["diag"]) < len(texts["tile"])
    with pytest.raises(ValueError, match="wfrag"):
        w4a16_wgmma.WgmmaConfig(4096, 4096, "none", False, False, 128, 2, 1, 4, decode=False)
