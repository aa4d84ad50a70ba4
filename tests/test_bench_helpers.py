"""CPU tests of the benchmark helpers the GPU A/B scripts share (``benchmarks/bench_moe.py``:
:func:`moe_gemms`): the MoE's GEMM operands built as the op builds them. Without CUDA the
Triton routing / gather run in Triton's interpreter (``tests/conftest.py``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the CPU path needs Triton's interpreter (no CUDA)")
@pytest.mark.parametrize("block_m,kperm", [(8, True), (16, True), (16, False)])
def test_moe_gemms_match_the_op_data_flow(block_m, kperm):
    import bench_moe

    from nvfp4_ops import get_shape
    from nvfp4_ops.kernels import linear_cuda
    from nvfp4_ops.kernels.triton import moe_routing
    from nvfp4_ops.testing import random_experts

    shape = get_shape("tiny")
    torch.manual_seed(0)
    experts = random_experts(shape.experts, shape.hidden, shape.intermediate).args()
    hidden, ids, weights = bench_moe.moe_inputs(shape, 9, 4, device="cpu")
    mg = bench_moe.moe_gemms(shape, experts, hidden, ids, weights, block_m, kperm)
    routing = moe_routing.moe_routing(ids, shape.experts, 0, block_m)
    a, row_scale = moe_routing.gather_rows(hidden, weights, routing, kperm)
    assert torch.equal(mg.routing.tile_expert, routing.tile_expert)
    g1, g2 = mg.gemm1, mg.gemm2
    # rows of skipped tiles are never written by the gather (nor read by the GEMMs)
    assert torch.equal(g1.a[mg.real], a[mg.real])
    assert torch.equal(g2.row_scale[mg.real], row_scale[mg.real])
    assert (g1.n, g1.k, g1.epilogue) == (2 * shape.intermediate, shape.hidden, "swiglu")
    assert (g2.n, g2.k, g2.epilogue) == (shape.hidden, shape.intermediate, "row_scale")
    assert g2.a is g1.out  # GEMM 2 reads GEMM 1's output
    assert g1.swiglu_limit == shape.swiglu_limit and g2.swiglu_limit is None
    assert g1.w is experts[0] and g2.w is experts[3]
    p = a.shape[0]
    assert g1.out.shape == (p, shape.intermediate) and g2.out.shape == (p, shape.hidden)
    real_tiles = int((routing.tile_expert >= 0).sum())
    assert mg.real.shape == (p,) and int(mg.real.sum()) == real_tiles * block_m
    # every routed slot's row lies in a real tile
    assert bool(mg.real[routing.slot_row.reshape(-1).long()].all())
    assert mg.m_tiles == min(p // block_m, linear_cuda._m_tiles_cap(True))


def test_l2_flush_modes():
    """``bench_moe.l2_flush``: ``write`` fills the buffer, ``read`` leaves it untouched, other
    modes are refused."""
    import bench_moe

    buf = torch.zeros(4096, dtype=torch.uint8)
    bench_moe.l2_flush(buf, "write")()
    assert int(buf.min()) == 1
    buf.zero_()
    bench_moe.l2_flush(buf, "read")()
    assert int(buf.max()) == 0
    with pytest.raises(ValueError, match="write or read"):
        bench_moe.l2_flush(buf, "evict")


_SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDS.U16 R4, [R2] ;
        /*0020*/                   F2FP.F16.E4M3.UNPACK_B R4, R4 ;
        /*0030*/                   HMUL2.BF16_V2 R8, R8, R4.H0_H0 ;
.L_x_2:
        /*0040*/                   HMMA.16816.F32.BF16 R12, R8, R6, R12 ;
        /*0050*/               @P0 BRA `(.L_x_2) ;
        /*0060*/                   LOP3.LUT R8, R8, 0x80008000, RZ, 0xc0, !PT ;
        /*0070*/               @P1 BRA `(.L_x_1) ;
        /*0080*/                   BRA `(.L_x_3) ;
.L_x_3:
        /*0090*/                   EXIT ;
"""


def test_dev_sass_finds_mma_loops_innermost_first():
    import dev_sass

    inner, outer = dev_sass.loops(_SASS)
    assert (inner["len"], inner["mma"]) == (2, 1)
    assert (outer["len"], outer["mma"]) == (7, 1)
    assert outer["classes"] == {"loads": 1, "scale cvt": 1, "hmul2": 1, "mma": 1,
                                "other": 2, "int decode": 1}


def test_dev_sass_counts_a_compiled_kernel(tmp_path):
    """The streamed M = 1 kernel's k loop: 16 ``mma.sync`` per step of 128 codes per lane, its
    block scales converted in the loop."""
    import dev_sass

    from nvfp4_ops.kernels import linear_cuda

    try:
        dev_sass.tool("ptxas"), dev_sass.tool("nvdisasm")
    except SystemExit as exc:
        pytest.skip(str(exc))
    cfg = linear_cuda.choose_config(7168, 18432, 8, "none", False, False, 1, wperm=True,
                                    wfrag=True)
    (loop, *_) = dev_sass.loops(dev_sass.sass_of(cfg, tmp_path / "k"))
    assert loop["mma"] == 16 and loop["classes"]["hmul2"] >= 64
    assert loop["classes"]["scale cvt"] > 0 and loop["len"] < 400


def test_dev_ab_tree_compiles_a_baseline_in_its_own_cache(tmp_path, monkeypatch):
    """The baseline worker imports the package under ``--baseline`` (here this tree's own
    folder) and leaves its binary in the cache folder of that package's sources."""
    import _ab
    import dev_ab_tree

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("NVFP4_OPS_CACHE_DIR", str(tmp_path / "cache"))
    ((name, path),) = dev_ab_tree.baseline_binaries(root, [(7168, 18432, 1)], 1).values()
    assert name == _ab.linear_config(7168, 18432, 1).name
    assert Path(path).is_file() and Path(path).is_relative_to(tmp_path / "cache")


def test_dev_ab_tree_refuses_a_baseline_it_did_not_import(tmp_path, monkeypatch):
    import dev_ab_tree

    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(RuntimeError, match="not .*" + tmp_path.name):
        dev_ab_tree._use_baseline(str(tmp_path))
    assert dev_ab_tree.main(["--baseline", str(tmp_path)]) == 2


def test_dev_sass_moe_cases_are_the_ops_grouped_configs():
    """Both MoE GEMMs at every tile both cover, configured as ``nvfp4::moe`` launches them."""
    import dev_sass

    from nvfp4_ops import get_shape
    from nvfp4_ops.kernels import linear_cuda

    shape = get_shape("v4-flash")
    cases = dev_sass.moe_cases("v4-flash")
    assert len(cases) == 2 * len(linear_cuda.BLOCK_MS)
    for label, cfg in cases:
        assert cfg.grouped and cfg.pdl and cfg.epilogue == (
            "swiglu" if "gate/up" in label else "row_scale")
        assert cfg.kperm == linear_cuda.grouped_kperm(shape.hidden, shape.intermediate,
                                                      cfg.block_m)


def test_ab_linear_config_is_the_ops_choice():
    """``_ab.linear_config`` (older API, for baseline trees) picks what ``nvfp4::linear``
    launches (``linear_cuda.linear_config``) at every token tile, prepared or not."""
    import _ab

    from nvfp4_ops.kernels import linear_cuda as L

    for n, k in ((7168, 18432), (18432, 7168), (4096, 4096)):
        for m in (1, 16, 32, 64, 128, 199, 1024, 8192):
            for prepared in (False, True):
                want = L.linear_config(n, k, m, wfrag=prepared)
                assert _ab.linear_config(n, k, m, prepared) == want, (n, k, m, prepared)
