"""CI: every CuTeDSL kernel variant that ``precompile --shape v4-flash|v4-pro`` can reach
(the MoE's MXFP4 variants included) compiles for sm_90a on a CPU-only machine (no driver
queries), and exports to an object file."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
pytest.importorskip("cutlass")

from nvfp4_ops import _warmup  # noqa: E402
from nvfp4_ops.kernels import dispatch, linear_cuda  # noqa: E402
from nvfp4_ops.kernels.cute import w4a16_gemm  # noqa: E402

# NVFP4 only, whatever NVFP4_OPS_MXFP4_SCALES says: the MXFP4 variants are MX_PLANS below
PLANS = [p for p in _warmup.plans_for(_warmup.layers_for_shapes(["v4-flash", "v4-pro"]))
         if not getattr(p.config, "mx", False)]


def test_variant_set_covers_every_block_m_and_epilogue():
    """Grouped (MoE): 2 shapes x 2 GEMMs x the policy's 5 token tiles
    (``dispatch.MOE_POLICY_TILES``), plus the decode tiles of each shape (at most
    ``PERSIST_MAX_TILES`` token tiles: the persistent gate/up, and the 4-warp down of a rank
    that expects a few experts' rows) and the down GEMM an expert-parallel rank walks with
    persistent CTAs past decode (``DOWN_TILES_CAP``). Dense
    (shared-expert MLP): 2 shapes x 2 GEMMs x 6 token tiles, plus the dense WGMMA tiles that
    depend on the number of token tiles (block_m 128: 1-2, 256: 2-16; 6 more configs over the
    two shapes). Every grouped plan reads a permuted order (the 32-block one at 16-256, the
    pair order at 8) and is launched with launch overlap; each has a twin reading wperm
    weights. Each dense plan has a twin reading the prepared order of nvfp4::to_wfrag_. The
    grouped base tiles that have a hot tile (16, 64, 128) have a twin launched beside it
    (``sibling``): 2 shapes x 2 orders x 2 GEMMs x 3."""
    names = {p.config.name for p in PLANS}
    tiles = len(dispatch.MOE_POLICY_TILES)
    grouped_plain = 2 * 2 * tiles + 2 * 2 + 2
    dense_plain = 2 * 2 * 6 + 6
    siblings = 2 * 2 * 2 * 3
    assert len(names) == len(PLANS) == 2 * grouped_plain + 2 * dense_plain + siblings
    assert {p.family for p in PLANS} == {"stream", "mma", "wgmma"}
    grouped = [p for p in PLANS if p.config.grouped]
    assert len(grouped) == 2 * grouped_plain + siblings
    assert {p.block_m for p in grouped} == set(dispatch.MOE_POLICY_TILES)
    assert all(p.config.permuted for p in grouped)
    sib = [p for p in grouped if p.config.sibling]
    assert len(sib) == siblings and {p.block_m for p in sib} == {16, 64, 128}
    assert sum(p.weight_order is dispatch.WeightOrder.WPERM for p in grouped) == len(grouped) // 2
    assert not any(p.config.order.fragment_order for p in grouped)
    dense = [p for p in PLANS if not p.config.grouped]
    assert sum(p.weight_order is dispatch.WeightOrder.WFRAG for p in dense) == len(dense) // 2
    assert len(dense) // 2 == dense_plain
    assert all(p.config.order is not dispatch.WeightOrder.WPERM for p in dense)
    assert {p.act_order for p in dense} == {"natural"}
    assert {p.act_order for p in grouped if p.block_m == 8} == {"pair"}
    assert {p.act_order for p in grouped if p.block_m > 8} == {"kperm"}
    persistent = [p for p in grouped if p.block_m == 8 and p.config.ctas > 0]
    assert sorted((p.config.epilogue, p.config.ctas) for p in persistent) == sorted(
        [("swiglu", dispatch.PERSIST_CTAS)] * 4
        + [("row_scale", h // 16 * dispatch.DOWN_TILES_CAP) for h in (4096, 7168)] * 2)
    decode_down = [p for p in grouped if p.block_m == 8 and p.config.epilogue == "row_scale"
                   and p.config.warps_k == 4]
    assert len(decode_down) == 4 and {p.config.stages for p in decode_down} == {3}
    assert all(p.config.pdl for p in grouped)
    # every plan the ops can launch at these sizes is among them
    for s_name in ("v4-flash", "v4-pro"):
        s = nvfp4_shape(s_name)
        for order in dispatch.WeightOrder:
            if order is not dispatch.WeightOrder.WPERM:
                for m in (1, 9, 17, 40, 100, 200, 300, 1000, 5000):
                    for plan in dispatch.plan_mlp(s.hidden, s.shared_intermediate, m,
                                                  order=order):
                        assert plan.config.name in names
            if order is dispatch.WeightOrder.WFRAG:
                continue
            for t in (1, 2, 5, 40, 200, 700, 3000, 20000):
                for e in (s.experts, s.experts // 8):
                    plan = dispatch.plan_moe(t, s.top_k, e, s.hidden, s.intermediate,
                                             order=order)
                    assert {plan.gate_up.config.name, plan.down.config.name} <= names


def nvfp4_shape(name):
    from nvfp4_ops import get_shape

    return get_shape(name)


#: the MoE's MXFP4 variants (UE8M0 scales per 32 k, ``mx``): every plan of both shapes on
#: ``wperm`` weights, as the glue prepares DeepSeek's checkpoints with
#: ``NVFP4_OPS_MXFP4_SCALES=auto`` (the default) on CUDA
MX_PLANS = _warmup.plans_for([
    _warmup.MoELayer(s.experts, s.hidden, s.intermediate, s.top_k, wperm=True, mx=True)
    for s in (nvfp4_shape("v4-flash"), nvfp4_shape("v4-pro"))])


@pytest.mark.parametrize("plan", PLANS + MX_PLANS, ids=lambda p: p.config.name)
def test_variant_compiles_for_sm90a(plan, tmp_path):
    cfg = plan.config
    compiled = linear_cuda.compile_function(cfg)(cfg)
    path = tmp_path / f"{cfg.name}.o"
    compiled.export_to_c(str(path), function_name=cfg.name)
    assert path.stat().st_size > 1000


def test_linear_test_shapes_compile():
    """The dense shapes the GPU tests and benchmark use (one per token tile class)."""
    for n, k in [(4096, 4096), (7168, 18432), (18432, 7168), (1536, 4096)]:
        for m in (1, 16, 64, 199, 8192):
            cfg = dispatch.plan_linear(n, k, m, has_bias=m == 1).config
            linear_cuda.compile_function(cfg)(cfg)


def test_bad_configs_rejected():
    with pytest.raises(ValueError):
        w4a16_gemm.GemmConfig(4096, 4000)  # K % 128
    with pytest.raises(ValueError):
        w4a16_gemm.GemmConfig(4096, 4096, block_m=24)
    with pytest.raises(ValueError):
        w4a16_gemm.GemmConfig(4096, 4096, epilogue="swiglu", has_bias=True)


def test_mx_variants_mirror_the_nvfp4_ones():
    """One mx twin per grouped wperm plan, nothing else changed but the TMA tensor copies of
    the persistent streamed tile (``dispatch._tma2d``: not for MXFP4's)."""
    import dataclasses

    def twin(cfg):
        fields = {"mx": True}
        if getattr(cfg, "tma2d", False) and cfg.ctas:
            fields["tma2d"] = False
        return dataclasses.replace(cfg, **fields).name

    grouped_wperm = {p.config.name: p.config for p in PLANS if p.config.grouped
                     and p.weight_order is dispatch.WeightOrder.WPERM}
    mx_names = {p.config.name for p in MX_PLANS}
    assert all(p.config.mx for p in MX_PLANS) and len(mx_names) == len(MX_PLANS)
    assert mx_names == {twin(cfg) for cfg in grouped_wperm.values()}
    assert any("_t2_mx_" in n for n in mx_names) and any("_p396_" in n and "_t2" not in n
                                                         for n in mx_names)


@pytest.mark.parametrize("block_m", [8, 16, 128])
def test_mx_ptx_reads_one_ue8m0_byte_per_32_k(block_m, tmp_path):
    """The mx twin of a V4-Flash gate/up GEMM reads UE8M0 bytes (a ``mad`` per scale into
    the decoders' bf16x2 form) and has no e4m3 conversion left; the streamed tile copies
    ``kc / 32`` scale bytes per row and stage instead of ``kc / 16``."""
    from nvfp4_ops.testing import kernel_ptx

    plans = {p.config.mx: p for p in (*PLANS, *MX_PLANS)
             if p.config.grouped and p.block_m == block_m and p.config.n == 4096
             and p.config.k == 4096 and p.weight_order is dispatch.WeightOrder.WPERM
             and not p.config.sibling and not getattr(p.config, "ctas", 0)}
    ptx = {mx: kernel_ptx(plans[mx].config, tmp_path / str(mx)) for mx in (False, True)}
    assert "e4m3x2" in ptx[False] and "e4m3x2" not in ptx[True]
    bias = "0x3b803b80"  # fp4_ptx: (b + 119) << 7 in both bf16 halves
    assert bias not in ptx[False].lower() and bias in ptx[True].lower()
    if block_m == 8:
        # the per-row bulk copies show their sizes (the dispatched tile takes TMA tensor
        # copies, whose boxes are in the tensor maps; MXFP4's persistent tile takes these)
        import dataclasses

        kc = plans[True].config.kc
        for mx, nbytes in ((False, kc // 16), (True, kc // 32)):
            bulk = dataclasses.replace(plans[mx].config, tma2d=False)
            text = kernel_ptx(bulk, tmp_path / f"bulk{mx}")
            copies = [line for line in text.splitlines() if "cp.async.bulk.shared" in line]
            assert any(f", {nbytes}, [" in line for line in copies), (mx, copies)
