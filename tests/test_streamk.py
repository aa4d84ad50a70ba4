"""Stream-K dense WGMMA tiles (``WgmmaConfig.streamk``): the configs compile for sm_90a and
refuse what they do not cover; on a GPU they equal the one-CTA-per-tile kernel up to fp32
summation order, bitwise reproducibly, and leave their tile counters at zero."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from nvfp4_ops.orders import WeightOrder

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


@pytest.mark.parametrize("items,per_item,ctas", [
    (96, 112, 132), (144, 112, 132), (56, 288, 132), (112, 288, 396), (8, 64, 132),
    (16, 1, 528), (3, 5, 7), (1, 2, 132), (288, 112, 528), (7, 3, 2), (2 * 96, 112, 131)])
def test_streamk_split_and_owners(items, per_item, ctas):
    """The kernel's own work split and owner formulas (:mod:`nvfp4_ops.kernels.cute.streamk`,
    evaluated eagerly on the CPU): the CTAs' ranges tile the units in order; ``item_owners``
    names exactly the CTAs whose range meets the item; each CTA holds at most two partial
    items, parked in distinct slots (1 for the item it begins, else 0)."""
    pytest.importorskip("cutlass")
    from cutlass import Int64

    from nvfp4_ops.kernels.cute import streamk

    units = items * per_item
    spans = [tuple(int(v) for v in streamk.span(Int64(units), b, ctas)) for b in range(ctas)]
    assert spans[0][0] == 0 and spans[-1][1] == units
    assert all(spans[b][1] == spans[b + 1][0] for b in range(ctas - 1))
    assert all(s <= e for s, e in spans)
    slots: dict[int, list[int]] = {b: [] for b in range(ctas)}
    for i in range(items):
        first, last = i * per_item, (i + 1) * per_item - 1
        lo, hi = (int(v) for v in streamk.item_owners(i, per_item, Int64(units), ctas))
        meets = [b for b, (s, e) in enumerate(spans) if s < last + 1 and first < e]
        assert meets == list(range(lo, hi + 1)), (i, lo, hi)
        if lo != hi:  # a split item: every piece is parked
            for b in meets:
                slots[b].append(1 if b == lo else 0)
    assert all(len(v) <= 2 and len(set(v)) == len(v) for v in slots.values())


#: WGMMA (N, K, M, block_m, row_wgs, stages, streamk[, extra fields]), all on 128-k stages: the
#: issue's 128-token shapes (three and two row warpgroups, one CTA per SM), the 16-32-token
#: tile, two token tiles (M = 199), a narrow layer whose tiles split over ~16 CTAs (1024 x
#: 4096), the block scales by cp.async a stage ahead (K = 4224: an odd number of stages, the
#: last one's "next" zero-filled), and launch overlap (what the dispatch uses: every stream-K
#: tile, scales ahead at 16-32 tokens)
WGMMA_CASES = [(18432, 7168, 128, 128, 3, 4, 1), (7168, 18432, 128, 128, 2, 4, 1),
               (18432, 7168, 16, 16, 1, 4, 3), (7168, 18432, 13, 16, 1, 4, 3),
               (7168, 18432, 29, 32, 1, 4, 3), (18432, 7168, 199, 128, 2, 4, 1),
               (1024, 4096, 77, 128, 2, 4, 1),
               *[(n, k, m, bm, 1, 4, 3, dict(scale_ahead=True))
                 for n, k, m, bm in ((18432, 7168, 16, 16), (7168, 18432, 13, 16),
                                     (7168, 18432, 29, 32), (4096, 4224, 16, 16))],
               (18432, 7168, 16, 16, 1, 4, 3, dict(scale_ahead=True, overlap="after")),
               (7168, 18432, 29, 32, 1, 4, 3, dict(scale_ahead=True, overlap="after")),
               (7168, 18432, 199, 128, 2, 4, 1, dict(overlap="after")),
               (1024, 4096, 77, 128, 2, 4, 1, dict(overlap="after"))]


def test_wgmma_streamk_config_compiles_and_errors():
    from nvfp4_ops.kernels.cute import w4a16_wgmma as W

    cfg = W.WgmmaConfig(18432, 7168, "none", False, False, 128, 3, 1, 4,
                        order=WeightOrder.WFRAG, streamk=1)
    assert cfg.stage_k == 128 and cfg.name.endswith("_wp_wf_sk1_sm_90a")
    assert cfg.partial_len == 3 * 64 * 128
    assert cfg.streamk_units(199) == (96 * 2, 96 * 2 * 56)
    assert callable(W.compile_gemm(cfg))
    for kw in (dict(split_k=2), dict(epilogue="swiglu"), dict(order=WeightOrder.CHECKPOINT)):
        with pytest.raises(ValueError, match="streamk is for dense 'none' problems"):
            W.WgmmaConfig(**{**dict(n=4096, k=4096, block_m=128, row_wgs=1,
                                    order=WeightOrder.WFRAG,
                                    streamk=1), **kw})
    with pytest.raises(ValueError, match="streamk must be >= 0"):
        W.WgmmaConfig(4096, 4096, "none", False, False, 128, 1, 1, streamk=-2)
    # stream-K runs 128-k stages, and only it does
    assert W.WgmmaConfig(4096, 4096, "none", block_m=128, row_wgs=1,
                         order=WeightOrder.WFRAG).stage_k == 64


def test_streamk_workspace_travels_in_its_own_operands(monkeypatch):
    """``run_gemm`` hands a stream-K plan's counters and scratch to the binary as its own
    ``counters`` / ``scratch`` operands (int32, fp32); the tile operands get one-element
    dummies, and a plan without stream-K gets dummies there instead (CPU: the binary is
    replaced by a recorder of its arguments)."""
    pytest.importorskip("cutlass")
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels.dispatch import WeightOrder, plan_linear

    calls = []
    monkeypatch.setattr(L, "compiled", lambda cfg: lambda *args: calls.append(args))
    n, k, m = 7168, 18432, 16
    x = torch.zeros(m, k, dtype=torch.bfloat16)
    w = torch.zeros(n, k // 2, dtype=torch.uint8)
    ws = torch.full((n, k // 16), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn)
    gv = L.per_group_global_view(torch.ones(()), n)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    plan = plan_linear(n, k, m, order=WeightOrder.WFRAG)
    assert plan.streamk
    counters = torch.zeros(plan.config.streamk_units(m)[0], dtype=torch.int32)
    scratch = torch.empty(4 * 2 * plan.config.partial_len, dtype=torch.float32)
    L.run_gemm(plan, x, w, ws, gv, out, workspace=L.StreamKWorkspace(counters, scratch))
    plain = plan_linear(n, k, m)
    assert not plain.streamk
    L.run_gemm(plain, x, w, ws, gv, out)
    streamk_args, plain_args = calls
    assert len(streamk_args) == len(plain_args) == 12
    assert streamk_args[9] is counters and streamk_args[10] is scratch
    assert streamk_args[5].numel() == streamk_args[6].numel() == 1
    assert plain_args[9].numel() == plain_args[10].numel() == 1
    assert (plain_args[9].dtype, plain_args[10].dtype) == (torch.int32, torch.float32)


def _wgmma_pair(n, k, m, bm, r, st, sk, bias, extra=None):
    """Plans of (the one-tile-per-CTA 64-k-stage tile, the stream-K one with ``extra``
    fields) on prepared weights."""
    from nvfp4_ops.kernels.cute import w4a16_wgmma as W
    from nvfp4_ops.kernels.dispatch import GemmPlan, WeightOrder

    base = W.WgmmaConfig(n, k, "none", bias, False, bm, r, 1, 6, order=WeightOrder.WFRAG)
    sk_cfg = dataclasses.replace(base, stages=st, streamk=sk, **(extra or {}))
    return tuple(GemmPlan("wgmma", c) for c in (base, sk_cfg))


@pytest.mark.gpu
@pytest.mark.parametrize("case", WGMMA_CASES, ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_streamk_matches_tiles_on_gpu(case, bias):
    """Stream-K vs the same tile without it, on wfrag + wperm weights: within fp32-order noise
    (max abs diff <= 1e-2 of the output's max), every element written (NaN-poisoned output),
    two runs bitwise equal, and the counters back at zero."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.orders import wfrag, wperm

    n, k, m = case[:3]
    base, plan = _wgmma_pair(*case[:7], bias, *case[7:])
    cfg = plan.config
    gen = torch.Generator(device="cuda").manual_seed(n + m)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    w = wperm.to_wperm(wfrag.to_wfrag(w))
    ws = (torch.rand(n, k // 16, device="cuda", generator=gen) * 3 + 2.0**-9).to(
        torch.float8_e4m3fn)
    gv = L.per_row_global_view(torch.rand(n, device="cuda", generator=gen) * 0.01 + 1e-3, n)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16) if bias else None
    outs = []
    for p in (base, plan, plan):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        L.run_gemm(p, x, w, ws, gv, out, bias=b)
        outs.append(out.float())
    ref, got, again = outs
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max() <= 1e-2 * ref.abs().max()
    assert torch.equal(got, again)
    # the kernel leaves its counters at zero (each item's finisher resets its own)
    counters = torch.zeros(cfg.streamk_units(m)[0], dtype=torch.int32, device="cuda")
    scratch = L.streamk_workspace(cfg, m, x.device).scratch
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    L.run_gemm(plan, x, w, ws, gv, out, bias=b,
               workspace=L.StreamKWorkspace(counters, scratch))
    torch.cuda.synchronize()
    assert int(counters.abs().sum()) == 0
    assert torch.equal(out.float(), got)


def test_dispatched_small_streamk_tiles_fit_their_ctas_per_sm(tmp_path):
    """The 16 / 32-token stream-K tiles the dispatch picks assume ``streamk`` CTAs resident per
    SM (the grid is that many per SM): their registers (ptxas, rounded up to 8 per thread) and
    ring must fit 3 CTAs in the 64 K registers and 227 KB of shared memory of an SM. 4 CTAs of
    the 16-token 128-k tile would need 4 x 256 threads x 80 registers (> 64 K); on H200 that
    grid ran 20 % slower (nvfp4_ops/kernels/DESIGN.md, "Stream-K")."""
    import re
    import subprocess

    from nvfp4_ops.kernels.dispatch import WeightOrder, plan_linear
    from nvfp4_ops.testing import find_cuda_tool, kernel_ptx

    try:
        ptxas = find_cuda_tool("ptxas")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    for n, k, m in ((18432, 7168, 16), (7168, 18432, 32)):
        cfg = plan_linear(n, k, m, order=WeightOrder.WFRAG).config
        assert cfg.streamk == 3 and cfg.stage_k == 128, cfg.name
        kernel_ptx(cfg, tmp_path / cfg.name)
        (ptx,) = (tmp_path / cfg.name).glob("*.ptx")
        info = subprocess.run([ptxas, "-arch=sm_90a", "-v", "-o", os.devnull, str(ptx)],
                              capture_output=True, text=True, check=True).stderr
        regs = int(re.search(r"Used (\d+) registers", info).group(1))
        threads = 128 * (cfg.consumers + 1)
        assert -(-regs // 8) * 8 * threads * cfg.streamk <= 65536, (cfg.name, regs)
        assert cfg.stage_bytes * cfg.num_stages * cfg.streamk <= 227 * 1024, cfg.name


def test_fixup_is_one_acquire_release_atomic(tmp_path):
    """The stream-K fix-up publishes and acquires the parked pieces with one acquire-release
    atomic by thread 0 between CTA barriers: no GPU-scope fence in the PTX."""
    from nvfp4_ops.kernels.cute import w4a16_wgmma as W
    from nvfp4_ops.testing import kernel_ptx

    cfg = W.WgmmaConfig(18432, 7168, "none", True, False, 16, 1, 1, 4, order=WeightOrder.WFRAG,
                        streamk=3)
    text = kernel_ptx(cfg, tmp_path / "fixup")
    assert text.count("atom.acq_rel.gpu") == 1 and "fence.acq_rel.gpu" not in text


def test_dispatched_streamk_configs_compile():
    """The stream-K tiles the dispatch picks for the benchmark's big shapes on prepared weights
    (16, 32, 128 and 199 tokens) compile for sm_90a."""
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels.dispatch import WeightOrder, plan_linear

    names = set()
    for n, k in ((7168, 18432), (18432, 7168)):
        for m in (16, 32, 128, 199):
            cfg = plan_linear(n, k, m, has_bias=m == 199, order=WeightOrder.WFRAG).config
            assert cfg.streamk > 0, cfg.name
            if cfg.name not in names:
                names.add(cfg.name)
                assert callable(L.compiled(cfg))
    assert len(names) == 8  # bm 16 / 32 / 128 (+ bias at 199) per shape


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 128])
def test_streamk_linear_in_cuda_graph_on_gpu(m):
    """``nvfp4.linear`` on prepared weights at (18432, 7168), where the dispatch picks stream-K
    tiles (their counters and scratch are allocated per call, inside the capture): a captured
    graph replayed with new inputs equals eager, bitwise, every time."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import nvfp4_ops
    from nvfp4_ops.format import quantize as quantize_nvfp4
    from nvfp4_ops.kernels.dispatch import WeightOrder, plan_linear

    n, k = 18432, 7168
    assert plan_linear(n, k, m, order=WeightOrder.WFRAG).streamk
    gen = torch.Generator(device="cuda").manual_seed(m)
    w, ws, wg = quantize_nvfp4(torch.randn(n, k, device="cuda", generator=gen))
    w = nvfp4_ops.to_wfrag_(w)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    nvfp4_ops.linear(x, w, ws, wg, wfrag=True)  # compile / load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = nvfp4_ops.linear(x, w, ws, wg, wfrag=True)
    for _ in range(3):
        x.copy_(torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, nvfp4_ops.linear(x, w, ws, wg, wfrag=True))


@pytest.mark.gpu
def test_streamk_chain_overlaps_and_reuses_counters_in_a_graph():
    """Two dense stream-K linears back to back, the second reading the first's output (launch
    overlap lets it start while the first finishes), eager and in a CUDA graph replayed with
    new inputs: each output within fp32-order noise of the reference on the same input, the
    graph bitwise equal to eager; under capture the tile counters come from one buffer per
    capture (the capture's id was read), and every buffer is back at zero."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import nvfp4_ops
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels.dispatch import WeightOrder, plan_linear
    from nvfp4_ops.reference import linear_fp32

    gen = torch.Generator(device="cuda").manual_seed(15)
    layers = []
    for n, k in ((7168, 18432), (18432, 7168)):
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
        s = (torch.rand(n, k // 16, device="cuda", generator=gen) + 0.5).to(torch.float8_e4m3fn)
        g = torch.rand(n, device="cuda", generator=gen) * 0.01 + 1e-3
        layers.append((w, nvfp4_ops.to_wfrag_(w.clone()), s, g))
        assert plan_linear(n, k, 16, order=WeightOrder.WFRAG).config.pdl

    def chain(x):
        ys = []
        for _, wf, s, g in layers:
            x = nvfp4_ops.linear(x, wf, s, g, wfrag=True)
            ys.append(x)
        return ys

    def check(x, ys):
        for (w, _, s, g), inp, y in zip(layers, (x, ys[0]), ys, strict=True):
            ref = linear_fp32(inp, w, s, g)
            assert ((y.float() - ref).norm() / ref.norm()).item() < 3e-3

    x = torch.randn(16, 18432, device="cuda", generator=gen).to(torch.bfloat16)
    check(x, chain(x))
    static_x = x.clone()
    chain(static_x)  # warm on this stream too
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_ys = chain(static_x)
    assert any(key[0] == "graph" for key in L._counters), "capture id not read"
    for _ in range(3):
        x = torch.randn(16, 18432, device="cuda", generator=gen).to(torch.bfloat16)
        static_x.copy_(x)
        graph.replay()
        eager = chain(x)
        torch.cuda.synchronize()
        check(x, eager)
        for a, b in zip(static_ys, eager, strict=True):
            assert torch.equal(a, b)
    assert all(int(buf.abs().sum()) == 0 for buf in L._counters.values())


def test_streamk_counters_env_is_checked(monkeypatch):
    """``NVFP4_OPS_STREAMK_COUNTERS`` takes ``reuse`` or ``per-call``; anything else is refused
    by name before any CUDA call."""
    from nvfp4_ops.kernels import linear_cuda as L

    monkeypatch.setenv(L.STREAMK_COUNTERS_ENV, "sometimes")
    with pytest.raises(ValueError, match="NVFP4_OPS_STREAMK_COUNTERS must be 'reuse' or "
                                         "'per-call', got 'sometimes'"):
        L.streamk_counters(4, torch.device("cuda", 0))
