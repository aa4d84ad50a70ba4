"""CI (CPU only): every WGMMA W4A16 variant the dispatch reaches for the dense linear shapes and
the V4-Flash / V4-Pro MoE + shared-expert shapes, for every token tile (and, dense, every
number of token tiles), compiles for sm_90a without a GPU and exports to an object file (what
the disk cache stores); plus the rules (register split, shared memory floor, the dense tile
choice, refused tiles)."""

from __future__ import annotations

import dataclasses
import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
pytest.importorskip("cutlass")

from nvfp4_ops.kernels import dispatch  # noqa: E402
from nvfp4_ops.kernels.cute import w4a16_wgmma  # noqa: E402
from nvfp4_ops.shapes import get_shape  # noqa: E402
from nvfp4_ops.testing import kernel_ptx  # noqa: E402

W = dispatch.WeightOrder


def _variants():
    """The WGMMA configs of every plan of the dense linears of the acceptance issues (both
    weight orders, with and without bias) and of each model's shared-expert MLP and routed
    experts."""
    linears = [(n, k, bias, order) for n, k in ((7168, 18432), (18432, 7168), (4096, 4096))
               for bias in (False, True) for order in (W.CHECKPOINT, W.WFRAG)]
    mlps, moes = [], []
    for name in ("v4-flash", "v4-pro"):
        s = get_shape(name)
        mlps += [(s.hidden, s.shared_intermediate, o) for o in (W.CHECKPOINT, W.WFRAG)]
        moes += [(s.hidden, s.intermediate, o, False) for o in (W.CHECKPOINT, W.WPERM)]
    plans = dispatch.reachable_plans(linears=linears, mlps=mlps, moes=moes)
    # the grouped 32-row tile: not in the op's policy (dispatch.MOE_POLICY_TILES), but the
    # tools and GPU tests force it (plan_moe(block_m=32))
    for hidden, inter, order, _ in moes:
        forced = dispatch.plan_moe(1024, 6, 256, hidden, inter, order=order, block_m=32)
        plans += [forced.gate_up, forced.down]
    return list({p.config.name: p.config for p in plans if p.family == "wgmma"}.values())


VARIANTS = _variants()


def _plan(n, k, bm, epilogue="none", **kw):
    return dispatch.plan_gemm(n, k, bm, epilogue=epilogue, **kw).config


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
            w4a16_wgmma.WgmmaConfig(18432, 7168, "none", **{"block_m": 128, "row_wgs": 3, **kw})


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
    32 take one row warpgroup and a 3-5 stage ring (dispatch.GROUPED_SMALL_TILES), 64 the row
    warpgroups of dispatch.grouped_row_wgs (four at this K, two below K = 3072)."""
    for bm in (16, 32, 64):
        cfg = _plan(4096, 4096, bm, "swiglu", grouped=True)
        small = dispatch.GROUPED_SMALL_TILES.get((bm, "swiglu"))
        assert cfg.consumers == (1 if small else dispatch.grouped_row_wgs(bm, 4096))
        assert cfg.num_stages == (small or 8)
        assert not cfg.uses_setmaxnreg
        assert w4a16_wgmma.W4A16WgmmaGemm(cfg).smem_bytes(50176) == 50176
    assert _plan(4096, 2048, 64, "row_scale", grouped=True).consumers == 2
    cfg = _plan(4096, 4096, 128, "swiglu", grouped=True)
    assert cfg.uses_setmaxnreg
    assert w4a16_wgmma.W4A16WgmmaGemm(cfg).smem_bytes(50176) == 116 * 1024


def test_dense_choice_follows_the_h200_sweep():
    """The wave estimate picks the measured best (or within 8%) tiles of the H200 sweep
    (DESIGN.md, "WGMMA tiles")."""
    def tile(n, k, bm, m_tiles):
        cfg = _plan(n, k, bm, m_tiles=m_tiles)
        return cfg.row_wgs, cfg.split_k

    assert tile(7168, 18432, 128, 1) == (1, 2)  # M=128: 83.4 us (bf16 74.2)
    # (18432, 7168): three row warpgroups: M=128 75.1 us vs r4 s1 95.6; M=199 143.7 vs r2 s2
    assert tile(18432, 7168, 128, 1) == (3, 1)
    assert tile(7168, 18432, 128, 2) == (2, 2)  # M=199: 135.7 us
    assert tile(18432, 7168, 128, 2) == (3, 1)
    # r3 only without epilogue or bias (what the H200 runs validated)
    assert _plan(18432, 7168, 128, has_bias=True, m_tiles=1).row_wgs != 3
    assert _plan(36864, 7168, 128, "swiglu", m_tiles=1).row_wgs != 3
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
        cfg = _plan(4096, 4096, block_m, "swiglu", grouped=True, permuted=True, chained=pdl)
        assert cfg.pdl == pdl and cfg.name.endswith("_pdl_sm_90a") == pdl
        text = kernel_ptx(cfg, tmp_path / str(pdl))
        counts[pdl] = [text.count(f"griddepcontrol.{op};") for op in ("wait", "launch_dependents")]
    assert counts == {False: [0, 0], True: [3, 1]}
    with pytest.raises(ValueError):
        w4a16_wgmma.WgmmaConfig(4096, 4096, "none", block_m=128, overlap="after")  # dense: no


def test_flexible_width_configs():
    """``flex`` (grouped, no split-K, 32 or 64 dividing block_m in at most four widths): the
    widths a CTA can run at, in the config's name; refused elsewhere."""
    cfg = w4a16_wgmma.WgmmaConfig(4096, 4096, "swiglu", grouped=True, block_m=128, flex=32)
    assert cfg.widths == (32, 64, 96, 128) and "_fx32_" in cfg.name
    assert w4a16_wgmma.WgmmaConfig(4096, 4096, "swiglu", grouped=True,
                                   block_m=256, flex=64).widths == (64, 128, 192, 256)
    assert w4a16_wgmma.WgmmaConfig(4096, 4096, "swiglu", grouped=True).widths == (128,)
    assert w4a16_wgmma.WgmmaConfig(4096, 4096, "swiglu", grouped=True, block_m=64,
                                   flex=16).widths == (16, 32, 48, 64)
    for kw in (dict(grouped=False), dict(block_m=256, flex=32), dict(flex=48),
               dict(block_m=32, flex=64)):
        with pytest.raises(ValueError, match="flex="):
            w4a16_wgmma.WgmmaConfig(4096, 4096, "none", **{"grouped": True, "block_m": 128,
                                                           "flex": 32, **kw})


def test_flexible_width_kernel_has_a_wgmma_per_width(tmp_path):
    """A flexible-width kernel holds one WGMMA shape per width (N = 32, 64, 96, 128 for a
    128-row tile at granularity 32), a whole-width one only its tile's."""
    import re

    def shapes(cfg, sub):
        text = kernel_ptx(cfg, tmp_path / sub)
        return sorted({int(n) for n in re.findall(r"wgmma\.mma_async\S*\.m64n(\d+)k16", text)})

    flex = _plan(4096, 4096, 128, "swiglu", grouped=True, permuted=True, chained=True,
                 flex=True)
    assert flex.flex == 32
    assert shapes(flex, "flex") == [32, 64, 96, 128]
    whole = _plan(4096, 4096, 128, "swiglu", grouped=True, permuted=True, chained=True)
    assert shapes(whole, "whole") == [128]
    sixteen = dataclasses.replace(
        _plan(4096, 4096, 64, "swiglu", grouped=True, permuted=True, chained=True, flex=True),
        flex=16)
    assert shapes(sixteen, "sixteen") == [16, 32, 48, 64]


def test_unrolled_k_loop_configs():
    """``unroll`` (the consumers' k loop by the ring depth): its own name tag, refused with
    split-K and stream-K."""
    cfg = w4a16_wgmma.WgmmaConfig(4096, 4096, "swiglu", grouped=True, block_m=16, row_wgs=1,
                                  stages=4, unroll=True)
    assert "_st4_un_" in cfg.name
    assert cfg.name != dataclasses.replace(cfg, unroll=False).name
    with pytest.raises(ValueError, match="unroll"):
        w4a16_wgmma.WgmmaConfig(18432, 7168, "none", block_m=128, row_wgs=1, split_k=2,
                                unroll=True)
    with pytest.raises(ValueError, match="unroll"):
        dataclasses.replace(_plan(18432, 7168, 128, m_tiles=1, order=W.WFRAG), unroll=True)


@pytest.mark.parametrize("k", [256, 384, 512, 1024])
def test_unrolled_k_loop_issues_every_tile_once(k, tmp_path):
    """An unrolled consumer (grouped 16-row tile, 4 ring stages) traces its first tile, one
    round of ``stages`` tiles (the runtime loop, when the middle tiles fill a round), the
    middle tiles past the last whole round and its last tile, four k16 WGMMAs each; the rolled
    loop traces three tiles whatever K is."""
    import re

    rolled = _plan(256, k, 16, "swiglu", grouped=True, permuted=True, chained=True)
    assert (rolled.block_m, rolled.row_wgs, rolled.num_stages) == (16, 1, 4)

    def wgmmas(cfg, sub):
        return len(re.findall(r"wgmma\.mma_async", kernel_ptx(cfg, tmp_path / sub)))

    nst = rolled.num_stages
    middle = k // w4a16_wgmma.BLOCK_K - 2
    tiles = 2 + (nst if middle >= nst else 0) + middle % nst
    assert wgmmas(dataclasses.replace(rolled, unroll=True), "unrolled") == 4 * tiles
    assert wgmmas(rolled, "rolled") == 4 * 3


@pytest.mark.parametrize("shape_name,block_m,gemm", [("v4-flash", 64, "gate_up"),
                                                     ("v4-flash", 256, "gate_up")])
def test_unrolled_moe_tiles_compile(shape_name, block_m, gemm, tmp_path):
    """V4-Flash's flexible-width MoE tiles, which the dispatch keeps rolled, with their k loop
    unrolled (64-row gate/up: four row warpgroups, 8 stages; 256-row gate/up: two, 6 stages;
    whole rounds and a remainder) compile for sm_90a and export (V4-Pro's unrolled tiles are
    dispatched, so the compile tests of every warm-up variant build them)."""
    s = get_shape(shape_name)
    plan = dispatch.plan_moe(block_m * s.experts // s.top_k, s.top_k, s.experts, s.hidden,
                             s.intermediate, order=W.WPERM, block_m=block_m, hot=False)
    planned = getattr(plan, gemm).config
    assert not planned.unroll
    cfg = dataclasses.replace(planned, unroll=True)
    assert cfg.flex and (cfg.k // w4a16_wgmma.BLOCK_K - 2) % cfg.num_stages
    compiled = w4a16_wgmma.compile_gemm(cfg)
    path = tmp_path / f"{cfg.name}.o"
    compiled.export_to_c(str(path), function_name=cfg.name)
    assert path.stat().st_size > 0
