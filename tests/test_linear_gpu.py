"""GPU tests of the CuTeDSL W4A16 GEMM behind ``nvfp4::linear`` / ``nvfp4::mlp`` (H100/H200).

Error bound: the kernel is exact up to fp32 summation order, so its relative L2 error against
the exact fp32 reference (``linear_fp32``) must be what rounding that reference to bf16 alone
gives (``err_round``), plus fp32-accumulation noise (1e-5 relative). NaN-poisoned outputs make
unwritten rows fail.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import nvfp4_ops
from nvfp4_ops.reference import linear_fp32, mlp_reference

pytestmark = pytest.mark.gpu

MS = [1, 7, 16, 64, 199, 1024, 8192]
# the op modules (their kept launches: ops._eager.Repeats); the package exports the wrappers
_LINEAR_OP = importlib.import_module("nvfp4_ops.ops.linear")
_MLP_OP = importlib.import_module("nvfp4_ops.ops.mlp")
NKS = [(4096, 4096), (7168, 18432), (18432, 7168), (1536, 4096)]


def random_nvfp4(n: int, k: int, gen: torch.Generator, per_row_global: bool = True):
    """Random codes, random positive e4m3 block scales (normals and subnormals), fp32 globals."""
    dev = "cuda"
    weight = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev, generator=gen)
    sc = torch.rand(n, k // 16, device=dev, generator=gen) * 3.0 + 2.0**-9
    weight_scale = sc.to(torch.float8_e4m3fn)
    if per_row_global:
        global_scale = torch.rand(n, device=dev, generator=gen) * 0.01 + 1e-3
    else:
        global_scale = torch.rand((), device=dev, generator=gen) * 0.01 + 1e-3
    return weight, weight_scale, global_scale


def random_experts(groups: int, n: int, k: int, gen: torch.Generator):
    """``groups`` experts of :func:`random_nvfp4`, stacked: codes ``[G, N, K/2]``, scales
    ``[G, N, K/16]``, per-row globals ``[G, N]``."""
    ws = [random_nvfp4(n, k, gen) for _ in range(groups)]
    return tuple(torch.stack([t[i] for t in ws]) for i in range(3))


def check_close(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert not torch.isnan(out).any(), f"{what}: NaN in output (unwritten rows?)"
    ref = ref.float()
    out = out.float()
    norm = ref.norm().clamp_min(1e-30)
    err = (out - ref).norm() / norm
    err_round = (ref.to(torch.bfloat16).float() - ref).norm() / norm
    assert err <= err_round * 1.05 + 1e-5, f"{what}: rel L2 {err:.3e} vs rounding {err_round:.3e}"
    # elementwise: within 1 bf16 ulp of the reference (plus fp32 accumulation noise)
    tol = ref.abs() * 2.0**-7 + ref.abs().max() * 1e-5
    bad = ((out - ref).abs() > tol).sum().item()
    assert bad == 0, f"{what}: {bad} elements beyond 1 bf16 ulp; max abs {(out - ref).abs().max()}"


@pytest.mark.parametrize("n,k", NKS)
def test_linear_vs_reference(n, k):
    gen = torch.Generator(device="cuda").manual_seed(n * 31 + k)
    weight, weight_scale, gscale = random_nvfp4(n, k, gen, per_row_global=(n != 4096))
    for m in MS:
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        ref = linear_fp32(x, weight, weight_scale, gscale)
        out = nvfp4_ops.linear(x, weight, weight_scale, gscale)
        check_close(out, ref, f"linear M={m} N={n} K={k}")


def test_repeated_eager_calls_follow_weight_updates():
    """Eager calls reuse their weight views (``linear_cuda.memo_views``): a weight written in
    place, a scale whose storage was swapped through ``.data`` (what vLLM's loaders do) and a
    new weight object are each seen by the next call."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    n, k = 1536, 4096
    weight, weight_scale, global_scale = random_nvfp4(n, k, gen)
    x = torch.randn(3, k, device="cuda", generator=gen).to(torch.bfloat16)

    def check(what):
        out = nvfp4_ops.linear(x, weight, weight_scale, global_scale)
        check_close(out, linear_fp32(x, weight, weight_scale, global_scale), what)
        return out

    first = check("first call")
    weight.copy_(torch.randint(0, 256, weight.shape, dtype=torch.uint8, device="cuda",
                               generator=gen))
    second = check("after an in-place weight write")
    global_scale.data = global_scale * 4.0
    third = check("after a .data swap of the global scale")
    assert not torch.equal(first, second) and torch.equal(third.float(), second.float() * 4)
    weight_scale = (weight_scale.float() * 0.5).to(torch.float8_e4m3fn)  # a new object
    check("with a new block-scale tensor")


def _kept_weights(gen: torch.Generator, wfrag: bool, k: int):
    """The kept-launch tests' weights at K = ``k``: a ``linear`` (N = 1536: codes, block
    scales, per-row globals, a bf16 bias), its codes in checkpoint order (for the reference),
    and an ``mlp`` with I = 512 (``w13, s13, g13, w2, s2, g2``); ``wfrag``: codes prepared by
    ``to_wfrag_``."""
    n, inter = 1536, 512
    weight, weight_scale, global_scale = random_nvfp4(n, k, gen)
    bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    w13, s13, _ = random_nvfp4(2 * inter, k, gen)
    w2, s2, g2 = random_nvfp4(k, inter, gen, per_row_global=False)
    g13 = torch.tensor([0.004, 0.007], device="cuda")
    plain = weight.clone()
    if wfrag:
        for w in (weight, w13, w2):
            nvfp4_ops.to_wfrag_(w)
    return weight, weight_scale, global_scale, bias, plain, (w13, s13, g13, w2, s2, g2)


@pytest.mark.parametrize("wfrag", [False, True])
def test_kept_launches_equal_fresh_ones(wfrag):
    """Repeated eager calls run the launch their first call kept (``ops._eager.Repeats``):
    ``linear`` with a bias and ``mlp`` at two SwiGLU limits, at token counts of every dense
    family (streamed, stream-K WGMMA, WGMMA), new activations each call: bitwise what a call
    that prepares its launch afresh gives, and close to the reference."""
    gen = torch.Generator(device="cuda").manual_seed(23 + wfrag)
    k = 4096
    weight, weight_scale, global_scale, bias, plain, (w13, s13, g13, w2, s2, g2) = (
        _kept_weights(gen, wfrag, k))
    for m in (1, 16, 128, 300):
        for _ in range(3):  # the first call keeps its launch, the next two repeat it
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            kept = nvfp4_ops.linear(x, weight, weight_scale, global_scale, bias, wfrag=wfrag)
            _LINEAR_OP._repeats.clear()
            fresh = nvfp4_ops.linear(x, weight, weight_scale, global_scale, bias, wfrag=wfrag)
            assert torch.equal(kept, fresh), f"linear M={m}: kept launch != fresh one"
            for limit in (7.0, 0.5):
                kept_mlp = nvfp4_ops.mlp(x, w13, s13, g13, w2, s2, g2, limit, wfrag=wfrag)
                _MLP_OP._repeats.clear()
                fresh_mlp = nvfp4_ops.mlp(x, w13, s13, g13, w2, s2, g2, limit, wfrag=wfrag)
                assert torch.equal(kept_mlp, fresh_mlp), f"mlp M={m} L={limit}: kept != fresh"
        assert len(_LINEAR_OP._repeats) >= 1 and len(_MLP_OP._repeats) >= 1
        ref = linear_fp32(x, plain, weight_scale, global_scale) + bias.float()
        check_close(kept, ref, f"linear M={m} wfrag={wfrag}, kept launch")


@pytest.mark.parametrize("wfrag", [False, True])
def test_kept_launches_replay_graphs_exactly(wfrag, monkeypatch):
    """Kept ``linear`` and ``mlp`` launches whose activations and outputs sit at an earlier
    call's addresses replay the call from a CUDA graph (``eager_graphs.AddressGraphs``): new
    activations written into the same tensor each call and each output freed before the
    next call give outputs bitwise those of the same calls launched one by one
    (``eager_graphs.ENABLED`` off), and graphs were captured, at token counts of the streamed
    and the WGMMA families."""
    from nvfp4_ops.kernels import eager_graphs

    real_capture = eager_graphs.capture
    gen = torch.Generator(device="cuda").manual_seed(31 + wfrag)
    k = 4096
    weight, weight_scale, global_scale, _, plain, (w13, s13, g13, w2, s2, g2) = (
        _kept_weights(gen, wfrag, k))
    for m in (1, 128):
        xs = [torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
              for _ in range(5)]
        x = torch.empty_like(xs[0])

        def run_all(xs=xs, x=x):
            # results copied into tensors made first: no allocation between the calls but
            # theirs, so each call's output (and mlp's intermediate) gets the address the
            # same call had before, as in a steady loop
            outs: list[torch.Tensor] = []
            for i, xi in enumerate(xs):
                x.copy_(xi)
                out = nvfp4_ops.linear(x, weight, weight_scale, global_scale, wfrag=wfrag)
                out_mlp = nvfp4_ops.mlp(x, w13, s13, g13, w2, s2, g2, 7.0, wfrag=wfrag)
                if i == 0:
                    outs = [torch.empty_like(t) for _ in xs for t in (out, out_mlp)]
                outs[2 * i].copy_(out)
                outs[2 * i + 1].copy_(out_mlp)
                del out, out_mlp  # free: the next call gets the same addresses
            return outs

        _LINEAR_OP._repeats.clear()
        _MLP_OP._repeats.clear()
        captured = []

        def counted(launch, device, what, captured=captured):
            captured.append(what)
            return real_capture(launch, device, what)

        monkeypatch.setattr(eager_graphs, "capture", counted)
        got = run_all()
        monkeypatch.setattr(eager_graphs, "capture", real_capture)
        assert {"nvfp4.linear", "nvfp4.mlp"} <= set(captured), f"M={m}: captured {captured}"
        monkeypatch.setattr(eager_graphs, "ENABLED", False)
        want = run_all()
        monkeypatch.setattr(eager_graphs, "ENABLED", True)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert torch.equal(g, w), f"M={m} call {i // 2} ({'mlp' if i % 2 else 'linear'})"
        ref = linear_fp32(xs[-1], plain, weight_scale, global_scale)
        check_close(got[-2], ref, f"linear M={m} wfrag={wfrag}, replayed graph")


@pytest.mark.parametrize("n,k", [(7168, 18432), (1536, 4096)])
def test_linear_per_tensor_and_per_channel_global(n, k):
    """The same weights with a per-tensor scalar (a stride-0 ``[1, 1, N]`` view) and a
    per-channel ``[N]`` global, at token counts of every family (tiles 8, 16-32, 64+)."""
    gen = torch.Generator(device="cuda").manual_seed(n + 3 * k)
    weight, weight_scale, per_channel = random_nvfp4(n, k, gen)
    per_tensor = torch.rand((), device="cuda", generator=gen) * 0.01 + 1e-3
    for m in (1, 13, 64, 199):
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        for name, gscale in (("per-tensor", per_tensor), ("per-channel", per_channel)):
            ref = linear_fp32(x, weight, weight_scale, gscale.expand(n).clone())
            out = nvfp4_ops.linear(x, weight, weight_scale, gscale)
            check_close(out, ref, f"linear {name} global M={m} N={n} K={k}")


@pytest.mark.parametrize("wfrag", [False, True])
def test_every_block_scale_byte(wfrag):
    """Block scales drawn from every e4m3 byte but the two NaNs (zero, negative, subnormal and
    the largest magnitudes too), at token counts of every dense family, on checkpoint and
    prepared (``to_wfrag_``) weights: the kernels' scale conversion must be exact for all of
    them, not only for the positive normals a quantizer writes."""
    gen = torch.Generator(device="cuda").manual_seed(11 + wfrag)
    n, k = 18432, 7168
    weight, _, gscale = random_nvfp4(n, k, gen)
    byte = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8,
                        device="cuda")
    pick = torch.randint(0, byte.numel(), (n, k // 16), device="cuda", generator=gen)
    weight_scale = byte[pick].view(torch.float8_e4m3fn)
    w = nvfp4_ops.to_wfrag_(weight.clone()) if wfrag else weight
    for m in (1, 16, 32, 128):
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        ref = linear_fp32(x, weight, weight_scale, gscale)
        out = nvfp4_ops.linear(x, w, weight_scale, gscale, wfrag=wfrag)
        check_close(out, ref, f"linear every scale byte wfrag={wfrag} M={m}")


def test_linear_bias_and_unsupported_fallback():
    gen = torch.Generator(device="cuda").manual_seed(5)
    for n, k in [(4096, 4096), (48, 96)]:  # second: K % 128 != 0 -> exact reference path
        weight, weight_scale, gscale = random_nvfp4(n, k, gen)
        bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
        for m in (1, 19, 77):
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            ref = linear_fp32(x, weight, weight_scale, gscale) + bias.float()
            out = nvfp4_ops.linear(x, weight, weight_scale, gscale, bias)
            check_close(out, ref, f"linear+bias M={m} N={n} K={k}")


_TILES = [8, 16, 32, 64, 128, 256]


# kperm (permuted activations) exists for every grouped tile: the 32-block order of the WGMMA
# family (16-256), the 8-block pair order of the streamed family (8)
@pytest.mark.parametrize("bm,kperm", [(bm, False) for bm in _TILES]
                         + [(bm, True) for bm in _TILES])
def test_grouped_gemm_poisoned_and_skipped_tiles(bm, kperm):
    """Every token tile of every kernel family on a grouped problem; ``kperm``: activations in
    the tile family's permuted order, SwiGLU output written in it (the MoE's path)."""

    gen = torch.Generator(device="cuda").manual_seed(7 + bm)
    groups, n, k = 3, 512, 1024
    w, w_scale, w_global = random_experts(groups, n, k, gen)
    tile_expert = torch.tensor([2, -1, 0, 0, 1, -1], dtype=torch.int32, device="cuda")
    rows = tile_expert.numel() * bm - 5
    a = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    row_scale = torch.rand(rows, device="cuda", generator=gen)
    for epilogue in ("none", "row_scale", "swiglu"):
        _run_and_check_grouped(a, tile_expert, w, w_scale, w_global, w_global, row_scale,
                               epilogue, bm, kperm)


def _run_and_check_grouped(a, tile_expert, w, w_scale, w_global, rows_global, row_scale,
                           epilogue, bm, kperm):
    """Run one planned grouped GEMM with the global-scale argument ``w_global`` into a NaN-poisoned
    output and check every tile against ``linear_fp32`` with the per-row globals
    ``rows_global`` fp32 ``[G, N]`` (contiguous, built independently)."""
    from nvfp4_ops.orders.kperm import to_layout
    from nvfp4_ops.reference.mlp import clamped_swiglu
    from nvfp4_ops.testing import planned_gemm

    rows, n = a.shape[0], w.shape[1]
    n_out = n // 2 if epilogue == "swiglu" else n
    layout = ("pair" if bm == 8 else "kperm") if kperm else "natural"
    out = torch.full((rows, n_out), float("nan"), dtype=torch.bfloat16, device="cuda")
    plan = planned_gemm(to_layout(a, layout), tile_expert, w, w_scale, w_global, out,
                        epilogue=epilogue, swiglu_limit=7.0, row_scale=row_scale, block_m=bm,
                        permuted=kperm)
    assert plan.act_order == layout
    for t, e in enumerate(tile_expert.tolist()):
        sl = slice(t * bm, min((t + 1) * bm, rows))
        if e < 0:
            assert torch.isnan(out[sl]).all(), f"{epilogue}: skipped tile {t} was written"
            continue
        ref = linear_fp32(a[sl], w[e], w_scale[e], rows_global[e])
        if epilogue == "row_scale":
            ref = ref * row_scale[sl, None]
        if epilogue == "swiglu":
            ref = clamped_swiglu(ref[:, : n // 2], ref[:, n // 2:], 7.0)
            ref = to_layout(ref, layout)
            out_t = out[sl].float()
            err = (out_t - ref).norm() / ref.norm()
            assert not torch.isnan(out_t).any() and err < 4e-3, f"swiglu tile {t}: {err}"
        else:
            check_close(out[sl], ref, f"grouped {epilogue} tile {t}")


@pytest.mark.parametrize("bm,kperm", [(bm, False) for bm in _TILES]
                         + [(bm, True) for bm in _TILES])
def test_grouped_gemm_stride0_global_views(bm, kperm):
    """The MoE's global-scale arguments on every kernel family: a gate/up pair per expert
    ``[G, 2]`` as the stride-0 view ``[G, 2, N/2]`` (``swiglu``; up = 3 x gate, so a swapped
    or averaged pair fails) and one scale per expert ``[G]`` as ``[G, 1, N]`` (``row_scale``,
    ``none``), against per-row globals expanded independently."""
    from nvfp4_ops.kernels.linear_cuda import gate_up_global_view, per_group_global_view

    gen = torch.Generator(device="cuda").manual_seed(23 + bm)
    groups, n, k = 3, 512, 1024
    w, w_scale, _ = random_experts(groups, n, k, gen)
    pair = torch.rand(groups, 2, device="cuda", generator=gen) * 0.01 + 1e-3
    pair[:, 1] = 3 * pair[:, 0]
    per_expert = torch.rand(groups, device="cuda", generator=gen) * 0.01 + 1e-3
    tile_expert = torch.tensor([1, 0, -1, 2, 2, 0], dtype=torch.int32, device="cuda")
    rows = tile_expert.numel() * bm - 3
    a = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    row_scale = torch.rand(rows, device="cuda", generator=gen)
    for epilogue in ("swiglu", "row_scale", "none"):
        if epilogue == "swiglu":
            view = gate_up_global_view(pair, n // 2)
            rows_global = torch.cat([pair[:, :1].repeat(1, n // 2),
                                     pair[:, 1:].repeat(1, n // 2)], dim=1)
        else:
            view = per_group_global_view(per_expert, n)
            rows_global = per_expert[:, None].repeat(1, n)
        assert view.stride()[2] == 0
        _run_and_check_grouped(a, tile_expert, w, w_scale, view, rows_global, row_scale,
                               epilogue, bm, kperm)


# swiglu at 6 token tiles runs persistent CTAs, at 12 one CTA per work item (the dispatch)
@pytest.mark.parametrize("tiles", [6, 12])
def test_grouped_stream_pair_order_matches_natural(tiles):
    """The streamed 8-token kernel with pair-order activations (``kperm``, the MoE's decode
    path): its B fragment holds the same k pairs as the natural kernel's (no ``prmt``, same
    MMAs), so every output is bitwise the natural kernel's (a SwiGLU output at its pair-order
    column), and the natural kernel matches the reference (checked here too). NaN-poisoned
    outputs, skipped tiles, padding rows (``tile_rows``) with NaN inputs."""
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.orders.kperm import from_layout, permute_pairs
    from nvfp4_ops.reference.mlp import clamped_swiglu
    from nvfp4_ops.testing import planned_gemm

    gen = torch.Generator(device="cuda").manual_seed(41 + tiles)
    groups, n, k, bm = 3, 1024, 2048, 8
    w, w_scale, w_global = random_experts(groups, n, k, gen)
    pattern = [2, -1, 0, 0, 1, -1, 1, 2, 0, 2, -1, 1]
    tile_expert = torch.tensor(pattern[:tiles], dtype=torch.int32, device="cuda")
    real = [(3 * t) % bm + 1 if e >= 0 else 0 for t, e in enumerate(pattern[:tiles])]
    tile_rows = torch.tensor(real, dtype=torch.int32, device="cuda")
    rows = tiles * bm
    a = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    for t, r in enumerate(real):
        a[t * bm + r:(t + 1) * bm] = float("nan")  # padding rows: never reach a real row
    a_pair = permute_pairs(a)
    row_scale = torch.rand(rows, device="cuda", generator=gen)
    for epilogue in ("swiglu", "row_scale", "none"):
        n_out = n // 2 if epilogue == "swiglu" else n
        plan = dispatch.plan_gemm(n, k, bm, epilogue=epilogue, grouped=True, m_tiles=tiles,
                                  permuted=True)
        assert plan.act_order == "pair" and plan.config.permuted
        assert epilogue != "swiglu" or (plan.config.ctas > 0) == (tiles <= 8)
        outs = {}
        for kperm in (False, True):
            out = torch.full((rows, n_out), float("nan"), dtype=torch.bfloat16, device="cuda")
            planned_gemm(a_pair if kperm else a, tile_expert, w, w_scale, w_global, out,
                         epilogue=epilogue, swiglu_limit=7.0, row_scale=row_scale, block_m=bm,
                         permuted=kperm, tile_rows=tile_rows)
            outs[kperm] = out
        got = from_layout(outs[True], "pair") if epilogue == "swiglu" else outs[True]
        for t, e in enumerate(tile_expert.tolist()):
            tile = slice(t * bm, (t + 1) * bm)
            if e < 0:
                assert torch.isnan(outs[True][tile]).all(), f"{epilogue}: skipped tile {t}"
                continue
            sl = slice(t * bm, t * bm + real[t])
            assert torch.equal(got[sl], outs[False][sl]), \
                f"{epilogue} tile {t}: pair order differs from natural"
            ref = linear_fp32(a[sl], w[e], w_scale[e], w_global[e])
            if epilogue == "swiglu":
                ref = clamped_swiglu(ref[:, : n // 2], ref[:, n // 2:], 7.0)
                err = (outs[False][sl].float() - ref).norm() / ref.norm()
                assert not torch.isnan(outs[False][sl]).any() and err < 4e-3, f"{t}: {err}"
            else:
                if epilogue == "row_scale":
                    ref = ref * row_scale[sl, None]
                check_close(outs[False][sl], ref, f"pair-order {epilogue} tile {t}")


@pytest.mark.parametrize("bm", [8, 16, 128])
def test_grouped_gemm_tile_rows_padding(bm):
    """``tile_rows``: NaN in the padding rows of the input (rows past each tile's real count)
    must not reach a real row's output, and the streamed 8-token tile computes padding rows
    from the tile's last real row (its activation loads are pointed there)."""
    from nvfp4_ops.reference.mlp import clamped_swiglu
    from nvfp4_ops.testing import planned_gemm

    gen = torch.Generator(device="cuda").manual_seed(31 + bm)
    groups, n, k = 3, 512, 1024
    w, w_scale, w_global = random_experts(groups, n, k, gen)
    tile_expert = torch.tensor([1, 0, -1, 2, 2, 0], dtype=torch.int32, device="cuda")
    real = [1, bm, 0, bm - 1, 3, 2]
    tile_rows = torch.tensor(real, dtype=torch.int32, device="cuda")
    rows = tile_expert.numel() * bm
    a = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    for t, r in enumerate(real):
        a[t * bm + r:(t + 1) * bm] = float("nan")
    row_scale = torch.rand(rows, device="cuda", generator=gen)
    for epilogue in ("row_scale", "swiglu"):
        n_out = n // 2 if epilogue == "swiglu" else n
        out = torch.full((rows, n_out), float("nan"), dtype=torch.bfloat16, device="cuda")
        planned_gemm(a, tile_expert, w, w_scale, w_global, out, epilogue=epilogue,
                     swiglu_limit=7.0, row_scale=row_scale, block_m=bm, tile_rows=tile_rows)
        for t, e in enumerate(tile_expert.tolist()):
            sl = slice(t * bm, t * bm + real[t])
            if e < 0:
                assert torch.isnan(out[t * bm:(t + 1) * bm]).all()
                continue
            ref = linear_fp32(a[sl], w[e], w_scale[e], w_global[e])
            if epilogue == "row_scale":
                ref = ref * row_scale[sl, None]
                check_close(out[sl], ref, f"tile_rows {epilogue} tile {t}")
            else:
                ref = clamped_swiglu(ref[:, : n // 2], ref[:, n // 2:], 7.0)
                err = (out[sl].float() - ref).norm() / ref.norm()
                assert not torch.isnan(out[sl]).any() and err < 4e-3, f"tile {t}: {err}"
            if bm == 8 and epilogue == "swiglu" and real[t] < bm:
                last = out[t * bm + real[t] - 1]
                pad = out[t * bm + real[t]:(t + 1) * bm]
                assert torch.equal(pad, last.expand_as(pad)), f"tile {t}: padding rows"


@pytest.mark.parametrize("shape", ["v4-flash", "v4-pro"])
def test_mlp_vs_reference(shape):
    s = nvfp4_ops.get_shape(shape)
    gen = torch.Generator(device="cuda").manual_seed(11)
    h, i = s.hidden, s.shared_intermediate
    w13, w13_scale, _ = random_nvfp4(2 * i, h, gen)
    w13_global = torch.rand(2, device="cuda", generator=gen) * 0.02 + 1e-3
    w13_global[1] = 2.5 * w13_global[0]  # gate != up: a swapped or averaged pair fails
    w2, w2_scale, w2_global = random_nvfp4(h, i, gen, per_row_global=False)
    for m in (1, 7, 16, 64, 199, 1024):
        x = torch.randn(m, h, device="cuda", generator=gen).to(torch.bfloat16)
        args = (x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, s.swiglu_limit)
        ref = mlp_reference(*args).float()
        out = torch.ops.nvfp4.mlp(*args)
        assert not torch.isnan(out).any()
        err = (out.float() - ref).norm() / ref.norm()
        # one bf16 rounding of the activation + output: a few 1e-3 (fp32 exp vs torch silu)
        assert err < 4e-3, f"mlp {shape} M={m}: rel L2 {err:.3e}"


@pytest.mark.parametrize("per_row_global", [True, False])
def test_cuda_graph_replay_new_inputs(per_row_global):
    gen = torch.Generator(device="cuda").manual_seed(13)
    n, k = 7168, 4096
    weight, weight_scale, gscale = random_nvfp4(n, k, gen, per_row_global)
    for m in (1, 16, 199):
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        nvfp4_ops.linear(x, weight, weight_scale, gscale)  # compile/load outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = nvfp4_ops.linear(x, weight, weight_scale, gscale)
        for _ in range(3):
            x.copy_(torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16))
            y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            eager = nvfp4_ops.linear(x, weight, weight_scale, gscale)
            assert torch.equal(y, eager), f"graph replay differs from eager at M={m}"
        # the graph reads the global scales through a view of the argument: an in-place
        # update is seen by the next replay
        gscale.mul_(2)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = nvfp4_ops.linear(x, weight, weight_scale, gscale)
        assert torch.equal(y, eager), f"replay after a global-scale update differs at M={m}"


def test_torch_compile_fullgraph_dynamic():
    gen = torch.Generator(device="cuda").manual_seed(17)
    n, k = 1536, 4096
    weight, weight_scale, gscale = random_nvfp4(n, k, gen)

    def f(x):
        return torch.ops.nvfp4.linear(x, weight, weight_scale, gscale, None) * 2

    cf = torch.compile(f, fullgraph=True, dynamic=True)
    for m in (3, 17, 200):
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        torch._dynamo.mark_dynamic(x, 0)
        assert torch.equal(cf(x), f(x))


def test_opcheck_cuda():
    gen = torch.Generator(device="cuda").manual_seed(19)
    weight, weight_scale, gscale = random_nvfp4(256, 512, gen)
    x = torch.randn(5, 512, device="cuda", generator=gen).to(torch.bfloat16)
    # block scales as raw bytes: torch's schema checker cannot compare fp8 CUDA tensors
    u8 = torch.uint8
    torch.library.opcheck(torch.ops.nvfp4.linear.default,
                          (x, weight, weight_scale.view(u8), gscale, None))
    s = nvfp4_ops.get_shape("tiny")
    w13, w13_scale, _ = random_nvfp4(2 * s.shared_intermediate, s.hidden, gen)
    w2, w2_scale, w2_global = random_nvfp4(s.hidden, s.shared_intermediate, gen, False)
    w13_global = torch.rand(2, device="cuda", generator=gen) + 0.1
    xh = torch.randn(3, s.hidden, device="cuda", generator=gen).to(torch.bfloat16)
    torch.library.opcheck(
        torch.ops.nvfp4.mlp.default,
        (xh, w13, w13_scale.view(u8), w13_global, w2, w2_scale.view(u8), w2_global, 10.0),
    )


def test_cold_process_warm_disk_cache_no_compile(tmp_path):
    """Process 1 warms the 'tiny' shape into a fresh disk cache; process 2 (guard on) warms up
    from disk and runs the MLP: zero compiles."""
    script = textwrap.dedent(
        """
        import sys, torch, nvfp4_ops
        from nvfp4_ops import _compile
        nvfp4_ops.warmup(["tiny"])
        s = nvfp4_ops.get_shape("tiny")
        h, i = s.hidden, s.shared_intermediate
        x = torch.randn(5, h, device="cuda").to(torch.bfloat16)
        w13 = torch.randint(0, 256, (2 * i, h // 2), dtype=torch.uint8, device="cuda")
        w13s = torch.ones(2 * i, h // 16, device="cuda").to(torch.float8_e4m3fn)
        w2 = torch.randint(0, 256, (h, i // 2), dtype=torch.uint8, device="cuda")
        w2s = torch.ones(h, i // 16, device="cuda").to(torch.float8_e4m3fn)
        g2 = torch.ones(2, device="cuda"); g1 = torch.ones((), device="cuda")
        nvfp4_ops.mlp(x, w13, w13s, g2, w2, w2s, g1, 10.0)
        torch.cuda.synchronize()
        print("COMPILES", _compile.compile_count())
        """
    )
    env = dict(os.environ, NVFP4_OPS_CACHE_DIR=str(tmp_path), NVFP4_OPS_DISK_CACHE="1")
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "COMPILES 0" not in first.stdout  # it really compiled into the empty cache
    env["NVFP4_OPS_NO_COMPILE_AFTER_WARMUP"] = "1"
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "COMPILES 0" in second.stdout, second.stdout
