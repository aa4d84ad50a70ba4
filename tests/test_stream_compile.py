"""CI: every streamed (8-token) config the dispatch plans for the V4-Flash / V4-Pro layer shapes
(shared-expert MLP and MoE GEMMs) and the two large linear shapes compiles for sm_90a on a
CPU-only machine and exports to an object file; the kernel's flags change the PTX as
intended."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
pytest.importorskip("cutlass")

from nvfp4_ops import get_shape  # noqa: E402
from nvfp4_ops.kernels import dispatch  # noqa: E402
from nvfp4_ops.kernels.cute import w4a16_stream  # noqa: E402
from nvfp4_ops.testing import kernel_ptx  # noqa: E402

LINEAR = [(7168, 18432), (18432, 7168)]


def _problems():
    """(n, k, epilogue, grouped) of every GEMM the shapes reach."""
    out = []
    for name in ("v4-flash", "v4-pro"):
        s = get_shape(name)
        # the shared-expert MLP (gate/up with SwiGLU, down) and the routed experts' grouped
        # gate/up (SwiGLU) and down (router weight as row_scale)
        out += [(2 * s.shared_intermediate, s.hidden, "swiglu", False),
                (s.hidden, s.shared_intermediate, "none", False),
                (2 * s.intermediate, s.hidden, "swiglu", True),
                (s.hidden, s.intermediate, "row_scale", True)]
    out += [(n, k, "none", False) for n, k in LINEAR]
    return out


def _stream(n, k, epilogue="none", has_bias=False, grouped=False, m_tiles=None, kperm=False,
            pdl=False, order=dispatch.WeightOrder.CHECKPOINT):
    plan = dispatch.plan_gemm(n, k, 8, epilogue=epilogue, has_bias=has_bias, grouped=grouped,
                              m_tiles=m_tiles, permuted=kperm, chained=pdl, order=order)
    assert plan.family == "stream", plan
    return plan.config


def _variants(kperm: bool = False):
    seen = {}
    for n, k, epi, grouped in _problems():
        if kperm and not grouped:
            continue
        cfg = _stream(n, k, epi, grouped=grouped, kperm=kperm)
        seen.setdefault(cfg.name, cfg)
    return list(seen.values())


VARIANTS = _variants()
#: the pair-order (``kperm``) configs of the grouped (MoE) problems
KPERM_VARIANTS = _variants(kperm=True)


def test_plan_contract():
    assert len(VARIANTS) == len(_problems())
    assert len(KPERM_VARIANTS) == 2 * 2
    natural = {c.name: c for c in VARIANTS}
    for cfg in KPERM_VARIANTS:
        # the same tile as the natural config, plus the order and the name suffix
        assert cfg.act_order == "pair" and "_kp_" in cfg.name
        twin = natural[cfg.name.replace("_kp_", "_")]
        assert not twin.permuted and cfg == type(cfg)(**{**vars(twin), "act_order": "pair"})
    for cfg in VARIANTS + KPERM_VARIANTS:
        assert cfg.name.startswith("w4a16s_") and cfg.name.isidentifier()
        assert cfg.n_out == (cfg.n // 2 if cfg.epilogue == "swiglu" else cfg.n)
        assert cfg.k % cfg.kc == 0 and cfg.n_out % cfg.rows_out == 0
        assert w4a16_stream.supported(cfg.n_out, cfg.k)
        assert cfg.smem_bytes <= 227 * 1024


@pytest.mark.parametrize("cfg", VARIANTS + KPERM_VARIANTS, ids=lambda c: c.name)
def test_variant_compiles_for_sm90a(cfg, tmp_path):
    compiled = w4a16_stream.compile_gemm(cfg)
    path = tmp_path / f"{cfg.name}.o"
    compiled.export_to_c(str(path), function_name=cfg.name)
    assert path.stat().st_size > 1000


def test_bias_tiles_persistent_compile():
    """Paths no plan above takes: the bias epilogue, persistent CTAs (grouped and dense)."""
    cfg_type = w4a16_stream.StreamConfig
    for cfg in (_stream(4096, 4096, "none", has_bias=True),
                cfg_type(4096, 4096, "swiglu", False, True, 8, 4, 2, 3, ctas=396),
                cfg_type(4096, 2048, "row_scale", False, True, 8, 2, 2, 2, ctas=792),
                cfg_type(7168, 18432, "none", False, False, 8, 4, 2, 4, ctas=264)):
        w4a16_stream.compile_gemm(cfg)
    assert "_p396_" in cfg_type(4096, 4096, ctas=396).name


@pytest.mark.parametrize("epilogue,n,k", [("swiglu", 4096, 4096), ("row_scale", 4096, 2048)])
def test_pair_order_drops_the_activation_prmt(epilogue, n, k, tmp_path):
    """With pair-order activations the B fragment is the loaded words: the PTX has no ``prmt``
    at all (the natural config's come only from pairing activation halves), and the same MMAs
    and activation loads."""
    counts = {}
    for kperm in (False, True):
        cfg = _stream(n, k, epilogue, grouped=True, kperm=kperm)
        text = kernel_ptx(cfg, tmp_path / str(kperm))
        counts[kperm] = {op: text.count(op) for op in ("prmt.b32", "mma.sync", "ld.global.nc.v4")}
    steps = 2  # 128-k steps per stage of these configs (4 words x 4 prmt x num_tiles each)
    assert counts[False]["prmt.b32"] == 16 * steps and counts[True]["prmt.b32"] == 0
    assert counts[True]["mma.sync"] == counts[False]["mma.sync"] > 0
    assert counts[True]["ld.global.nc.v4"] == counts[False]["ld.global.nc.v4"] > 0


@pytest.mark.parametrize("epilogue,n,k,m_tiles", [("swiglu", 4096, 4096, 6),
                                                   ("swiglu", 4096, 4096, 9),
                                                   ("row_scale", 4096, 2048, 6)])
def test_launch_overlap_waits(epilogue, n, k, m_tiles, tmp_path):
    """``pdl``: the consumers wait for the previous grid (``griddepcontrol.wait``) and then let
    the next one launch; a CTA without a real tile waits only if it is CTA 0 (a second wait in
    the PTX). Without ``pdl`` neither instruction is emitted (persistent and one-item CTAs)."""
    counts = {}
    for pdl in (False, True):
        cfg = _stream(n, k, epilogue, grouped=True, m_tiles=m_tiles, kperm=True, pdl=pdl)
        assert cfg.pdl == pdl and ("_pdl_" in cfg.name) == pdl
        text = kernel_ptx(cfg, tmp_path / str(pdl))
        counts[pdl] = [text.count(f"griddepcontrol.{op};") for op in ("wait", "launch_dependents")]
    assert counts == {False: [0, 0], True: [2, 1]}


def test_bad_configs_rejected():
    bad = [
        dict(n=4096, k=4096 + 128),  # K not a multiple of the 1024-k chunk
        dict(n=4096, k=4096, block_m=64),  # prefill tiles are w4a16_gemm's
        dict(n=4096, k=4096, block_m=16),  # 16 tokens: WGMMA or mma.sync
        dict(n=4096, k=4096, epilogue="swiglu", has_bias=True),
        dict(n=4096, k=4096, stages=12),
        dict(n=4104, k=4096),  # N % 16
        dict(n=4096, k=4096, ctas=-1),
        dict(n=4096, k=4096, act_order="pair"),  # pair order: grouped problems only
        dict(n=4096, k=4096, grouped=True, act_order="kperm"),  # the WGMMA family's order
        dict(n=4096, k=4096, overlap="after"),  # launch overlap: the MoE's grouped GEMMs only
        dict(n=4096, k=4096, grouped=True, overlap="beside"),  # WGMMA tiles only
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            w4a16_stream.StreamConfig(**kw)
    assert not w4a16_stream.supported(4096, 4096 + 128)
    # K % 256 != 0: the dispatch gives the 8-token tile to mma.sync instead
    assert dispatch.plan_gemm(4096, 4096 + 128, 8).family == "mma"


@pytest.mark.parametrize("n,k", LINEAR)
def test_tma2d_fills_a_stage_with_two_tensor_copies(n, k, tmp_path):
    """``tma2d``: the dispatched M = 1 config on prepared weights loads each stage with two 3D
    TMA tensor copies (codes, scales) instead of two bulk copies per weight row, with the same
    MMAs; without the flag the kernel is unchanged (bulk copies, no tensor copy)."""
    import dataclasses

    shipped = _stream(n, k, m_tiles=1, order=dispatch.WeightOrder.WFRAG)
    assert shipped.tma2d == (n == 7168)  # (18432, 7168): 7 chunks per CTA, 1152 CTAs
    base = dataclasses.replace(shipped, tma2d=False)
    t2 = dataclasses.replace(base, tma2d=True)
    assert t2.name.endswith("_t2_sm_90a") and t2.stage_bytes == 16 * (t2.kc // 2 + t2.kc // 16)
    counts = {}
    for name, cfg in (("base", base), ("t2", t2)):
        text = kernel_ptx(cfg, tmp_path / name)
        counts[name] = {op: text.count(op) for op in (
            "cp.async.bulk.tensor.3d", "cp.async.bulk.shared::cluster.global", "mma.sync")}
    assert counts["base"]["cp.async.bulk.tensor.3d"] == 0
    assert counts["base"]["cp.async.bulk.shared::cluster.global"] > 0
    assert counts["t2"]["cp.async.bulk.tensor.3d"] == 2
    assert counts["t2"]["cp.async.bulk.shared::cluster.global"] == 0
    assert counts["t2"]["mma.sync"] == counts["base"]["mma.sync"] > 0


@pytest.mark.parametrize("epilogue,m_tiles,mx", [
    ("swiglu", 1, False), ("swiglu", 16, True), ("row_scale", 16, False), ("row_scale", 1, True)])
def test_grouped_tma2d_copies_one_box_per_row_set(epilogue, m_tiles, mx, tmp_path):
    """``tma2d`` on the MoE's streamed GEMMs (V4-Flash, as ``nvfp4::moe`` plans them: pair
    order, launch overlap, persistent CTAs at decode, NVFP4 or MXFP4 scales): per stage one TMA
    tensor copy per operand and 16-row set (SwiGLU: gate and up boxes, 4 copies; down: 2)
    replace the per-row bulk copies; the MMAs are the same."""
    import dataclasses

    s = get_shape("v4-flash")
    n, k = (2 * s.intermediate, s.hidden) if epilogue == "swiglu" else (s.hidden, s.intermediate)
    shipped = dispatch.plan_gemm(n, k, 8, epilogue=epilogue, grouped=True, m_tiles=m_tiles,
                                 permuted=True, chained=True, mx=mx,
                                 order=dispatch.WeightOrder.WPERM).config
    assert shipped.pdl and shipped.mx == mx
    assert (shipped.ctas > 0) == (epilogue == "swiglu" and m_tiles == 1)
    # the dispatch: gate/up with tensor copies, but not MXFP4's persistent tile; down without
    assert shipped.tma2d == (epilogue == "swiglu" and not (mx and shipped.ctas))
    base = dataclasses.replace(shipped, tma2d=False)
    t2 = dataclasses.replace(base, tma2d=True)
    sets = t2.rows_phys // w4a16_stream.SET_ROWS
    assert t2.stage_bytes == -(-t2.rows_phys * (t2.kc // 2 + t2.kc // t2.scale_k) // 128) * 128
    counts = {}
    for name, cfg in (("base", base), ("t2", t2)):
        text = kernel_ptx(cfg, tmp_path / name)
        counts[name] = {op: text.count(op) for op in (
            "cp.async.bulk.tensor.3d", "cp.async.bulk.shared::cluster.global", "mma.sync",
            "griddepcontrol.wait")}
    assert counts["base"]["cp.async.bulk.tensor.3d"] == 0
    assert counts["t2"] == {**counts["base"], "cp.async.bulk.tensor.3d": 2 * sets,
                            "cp.async.bulk.shared::cluster.global": 0}
