"""Global scales reach the GEMM kernels as zero-copy views ``[G, H2, N / H2]``
(:mod:`nvfp4_ops.kernels.linear_cuda`, :mod:`nvfp4_ops.kernels.cute.gemm_interface`).

CPU checks: the view builders share the input's storage (same ``data_ptr``, stride 0 where a
scale is broadcast) and hold the right value for every weight row once materialised; the
linear / MLP / MoE glue hands the GEMM binary such views (the binary is replaced by a recorder,
so nothing launches); ``run_gemm`` rejects wrong ``w_global`` shapes with a clear
message. The kernels reading these views on the GPU: ``tests/test_linear_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from nvfp4_ops.kernels import dispatch, linear_cuda
from nvfp4_ops.kernels.linear_cuda import (
    gate_up_global_view,
    per_group_global_view,
    per_row_global_view,
)


def _shares_storage(view: torch.Tensor, base: torch.Tensor) -> bool:
    return (view.data_ptr() == base.data_ptr()
            and view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr())


def _positive(*shape: int) -> torch.Tensor:
    return torch.rand(shape) + 0.5


# --- the builders, one case per op argument form ---------------------------------------------


def test_per_tensor_scalar_is_a_stride0_view():  # linear's [] global, the MLP's w2_global
    n = 48
    scale = _positive()
    view = per_group_global_view(scale, n)
    assert view.shape == (1, 1, n) and view.stride() == (0, 0, 0)
    assert _shares_storage(view, scale)
    assert torch.equal(view.contiguous(), torch.full((1, 1, n), scale.item()))


def test_per_expert_scale_is_a_stride0_view():  # the MoE's w2_global [E]
    experts, n = 5, 32
    scale = _positive(experts)
    view = per_group_global_view(scale, n)
    assert view.shape == (experts, 1, n) and view.stride()[2] == 0
    assert _shares_storage(view, scale)
    for e in range(experts):
        assert torch.equal(view[e, 0], torch.full((n,), scale[e].item()))


def test_per_expert_scale_from_a_strided_column():
    """A non-contiguous ``[E]`` (a column of a bigger table) keeps its stride."""
    table = _positive(6, 3)
    scale = table[:, 1]
    view = per_group_global_view(scale, 16)
    assert view.stride() == (3, 3, 0) and _shares_storage(view, scale)
    assert torch.equal(view.contiguous()[:, 0, 7], scale)


@pytest.mark.parametrize("lead", [(), (4,)])
def test_gate_up_pair_is_a_stride0_view(lead):  # the MLP's w13_global [2], the MoE's [E, 2]
    inter = 24
    pair = _positive(*lead, 2)
    pair[..., 1] = 3 * pair[..., 0]  # distinct, so a swap shows
    view = gate_up_global_view(pair, inter)
    groups = lead[0] if lead else 1
    assert view.shape == (groups, 2, inter) and view.stride()[2] == 0
    assert _shares_storage(view, pair)
    rows = view.reshape(groups, 2 * inter)  # the per-row globals of rows 0 .. 2I - 1
    pair2 = pair.reshape(groups, 2)
    for g in range(groups):
        assert torch.equal(rows[g, :inter], pair2[g, 0].expand(inter))  # gate rows
        assert torch.equal(rows[g, inter:], pair2[g, 1].expand(inter))  # up rows


def test_per_channel_rows_are_a_view():  # linear's [N] global
    n = 40
    scale = _positive(n)
    view = per_row_global_view(scale, n)
    assert view.shape == (1, 1, n) and _shares_storage(view, scale)
    assert torch.equal(view.reshape(n), scale)


@pytest.mark.parametrize("halves", [1, 2])
def test_per_row_table_any_strides_is_a_view(halves):  # run_gemm's [G, N] form
    groups, n = 3, 32
    table = _positive(n, groups).t()  # [G, N] with strides (1, G): not contiguous
    view = per_row_global_view(table, n, halves)
    assert view.shape == (groups, halves, n // halves) and _shares_storage(view, table)
    assert view.stride() == (1, groups * n // halves, groups)
    assert torch.equal(view.reshape(groups, n), table)


def test_builders_reject_wrong_forms():
    with pytest.raises(ValueError, match=r"per-group global scale must be fp32 \[\] or \[G\]"):
        per_group_global_view(_positive(2, 2), 8)
    with pytest.raises(ValueError, match="per-group global scale must be fp32"):
        per_group_global_view(_positive(3).double(), 8)
    with pytest.raises(ValueError, match=r"gate/up global scales must be fp32 \[G, 2\]"):
        gate_up_global_view(_positive(3), 8)
    with pytest.raises(ValueError, match=r"gate/up global scales must be fp32 \[G, 2\]"):
        gate_up_global_view(_positive(2).half(), 8)
    with pytest.raises(ValueError, match=r"per-row global scales must be fp32 \[G, 16\]"):
        per_row_global_view(_positive(2, 15), 16)
    with pytest.raises(ValueError, match="divisible by 2"):
        per_row_global_view(_positive(2, 15), 15, 2)


# --- the glue passes views to the binary ------------------------------------------------------


@pytest.fixture
def recorded(monkeypatch):
    """Replace the compiled GEMM by a recorder of its arguments (no launch); the rest of the
    torch-side path (dispatch, validation, ``run_gemm``) runs for real."""
    pytest.importorskip("cutlass")  # the dispatch imports the kernel modules
    calls = []

    def fake_compiled(cfg):
        def fn(a, w, w_scale, w_global, out, tile_expert, tile_rows, row_scale, bias, counters,
               scratch, limit):
            calls.append((cfg, w_global))
            out.zero_()

        return fn

    monkeypatch.setattr(linear_cuda, "compiled", fake_compiled)
    return calls


def _nvfp4(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    return w, torch.full((n, k // 16), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("m", [1, 100])
def test_linear_passes_a_view(recorded, per_channel, m):
    n, k = 256, 256
    w, s = _nvfp4(n, k)
    scale = _positive(n) if per_channel else _positive()
    x = torch.randn(m, k).to(torch.bfloat16)
    linear_cuda.linear(x, w, s, scale, None)
    ((_, w_global),) = recorded
    assert w_global.shape == (1, 1, n) and _shares_storage(w_global, scale)
    assert w_global.stride()[2] == (1 if per_channel else 0)
    assert torch.equal(w_global.reshape(n), scale.expand(n))


def test_mlp_passes_views(recorded):
    hidden, inter = 256, 128
    w13, s13 = _nvfp4(2 * inter, hidden)
    w2, s2 = _nvfp4(hidden, inter)
    g13 = torch.tensor([0.25, 0.75])
    g2 = _positive()
    x = torch.randn(3, hidden).to(torch.bfloat16)
    linear_cuda.mlp(x, w13, s13, g13, w2, s2, g2, 10.0)
    (cfg1, v13), (cfg2, v2) = recorded
    assert cfg1.epilogue == "swiglu" and cfg2.epilogue == "none"
    assert v13.shape == (1, 2, inter) and v13.stride()[2] == 0 and _shares_storage(v13, g13)
    assert torch.equal(v13[0, 0], torch.full((inter,), 0.25))
    assert torch.equal(v13[0, 1], torch.full((inter,), 0.75))
    assert v2.shape == (1, 1, hidden) and v2.stride() == (0, 0, 0) and _shares_storage(v2, g2)


def test_moe_passes_views():
    """``moe_forward`` hands both grouped GEMMs views of ``w13_global [E, 2]`` / ``w2_global
    [E]`` (a recording ``gemm``; routing, gather and combine run for real: Triton's
    interpreter on CPU, compiled on CUDA)."""
    from nvfp4_ops.kernels.moe_cuda import moe_forward
    from nvfp4_ops.testing import random_routing

    device = "cuda" if torch.cuda.is_available() else "cpu"
    experts, hidden, inter, tokens, top_k = 4, 256, 128, 5, 2
    w13 = torch.zeros(experts, 2 * inter, hidden // 2, dtype=torch.uint8, device=device)
    s13 = torch.zeros(experts, 2 * inter, hidden // 16, dtype=torch.uint8, device=device)
    w2 = torch.zeros(experts, hidden, inter // 2, dtype=torch.uint8, device=device)
    s2 = torch.zeros(experts, hidden, inter // 16, dtype=torch.uint8, device=device)
    g13 = _positive(experts, 2).to(device)
    g2 = _positive(experts).to(device)
    calls = []

    def gemm(plan, a, w, w_scale, w_global, out, **_):
        calls.append((plan.config.epilogue, w_global, a, out))

    ids, weights = random_routing(tokens, experts, top_k, device=device)
    hidden_states = torch.randn(tokens, hidden, device=device).to(torch.bfloat16)
    plan = dispatch.plan_moe(tokens, top_k, experts, hidden, inter, block_m=8)
    moe_forward(hidden_states, ids, weights, w13, s13, g13, w2, s2, g2, 0, None, 1.0,
                plan=plan, gemm=gemm)
    (epi1, v13, a1, _), (epi2, v2, _, out2) = calls
    assert epi1 == "swiglu" and epi2 == "row_scale"
    # one [P, H] buffer per call: GEMM 2 writes over GEMM 1's input
    assert out2.data_ptr() == a1.data_ptr() and out2.shape == a1.shape
    assert v13.shape == (experts, 2, inter) and v13.stride()[2] == 0
    assert v2.shape == (experts, 1, hidden) and v2.stride()[2] == 0
    assert _shares_storage(v13, g13) and _shares_storage(v2, g2)
    assert torch.equal(v13.reshape(experts, 2 * inter), g13.repeat_interleave(inter, dim=1))
    assert torch.equal(v2.reshape(experts, hidden), g2[:, None].expand(experts, hidden))


# --- views reused between eager calls (memo_views) -------------------------------------------


def test_linear_reuses_its_views_for_the_same_weights(recorded):
    n, k = 256, 256
    w, s = _nvfp4(n, k)
    scale = _positive()
    x = torch.randn(2, k).to(torch.bfloat16)
    linear_cuda.linear(x, w, s, scale, None)
    linear_cuda.linear(x, w, s, scale, None)
    (_, first), (_, second) = recorded
    assert second is first  # the same view object: nothing rebuilt


def test_views_follow_a_swapped_storage(recorded):
    """``.data = ...`` (what vLLM's loaders and weight reloads do) keeps the tensor object
    but changes what its views must see: the next call builds new ones."""
    n, k = 256, 256
    w, s = _nvfp4(n, k)
    scale = _positive(n)
    x = torch.randn(1, k).to(torch.bfloat16)
    linear_cuda.linear(x, w, s, scale, None)
    scale.data = _positive(n)  # new storage, same object
    linear_cuda.linear(x, w, s, scale, None)
    (_, before), (_, after) = recorded
    assert after is not before and _shares_storage(after, scale)
    assert torch.equal(after.reshape(n), scale)


def test_views_follow_an_in_place_write(recorded):
    """An in-place write keeps the storage: the same views read the new values."""
    n, k = 256, 256
    w, s = _nvfp4(n, k)
    scale = _positive(n)
    x = torch.randn(1, k).to(torch.bfloat16)
    linear_cuda.linear(x, w, s, scale, None)
    scale.copy_(_positive(n))
    linear_cuda.linear(x, w, s, scale, None)
    (_, before), (_, after) = recorded
    assert after is before and torch.equal(after.reshape(n), scale)


def test_views_are_keyed_by_shape_too():
    """A tensor reshaped in place to the same address misses the memo."""
    t = torch.zeros(4, 8)
    first = linear_cuda.memo_views("test-shape", (t,), lambda: (t.view(-1),))
    t.data = t.data.view(8, 4)  # same address, another shape
    second = linear_cuda.memo_views("test-shape", (t,), lambda: (t.view(-1), "rebuilt"))
    assert len(first) == 1 and second[1] == "rebuilt"


@pytest.mark.parametrize("build", ["view", "itself"])
def test_views_go_with_their_tensors(build):
    """The memo keeps no weight alive: once a weight is dropped, its entry (and what holds
    its storage) goes, whether the memo kept a view of it or the tensor as it was (a 3-D
    weight, or a parameter)."""
    import gc
    import weakref

    t = torch.nn.Parameter(torch.zeros(1024), requires_grad=False)
    storage = weakref.ref(t.untyped_storage())
    views = linear_cuda.memo_views(
        "test-drop", (t,), lambda t=t: (t.view(32, 32),) if build == "view" else (t,))
    assert views[0].data_ptr() == t.data_ptr() and views[0] is not t
    key = ("test-drop", id(t))
    assert key in linear_cuda._views
    del t, views
    gc.collect()
    assert key not in linear_cuda._views
    assert storage() is None


def test_moe_views_go_with_their_weights():
    """``moe_forward``'s memo entry (3-D weights passed on unchanged) goes with the weights."""
    import gc

    e, h, i = 2, 64, 32
    weights = [torch.zeros(e, 2 * i, h // 2, dtype=torch.uint8),
               torch.zeros(e, 2 * i, h // 16, dtype=torch.uint8), torch.ones(e, 2),
               torch.zeros(e, h, i // 2, dtype=torch.uint8),
               torch.zeros(e, h, i // 16, dtype=torch.uint8), torch.ones(e)]
    linear_cuda.memo_views("test-moe", tuple(weights),
                           lambda w=weights: linear_cuda.gated_kernel_weights(*w))
    key = ("test-moe", *map(id, weights))
    assert key in linear_cuda._views
    del weights
    gc.collect()
    assert key not in linear_cuda._views


# --- run_gemm's argument check ----------------------------------------------------------------


def _grouped_plan(epilogue: str):
    pytest.importorskip("cutlass")
    return dispatch.plan_gemm(64, 128, 16, epilogue=epilogue, grouped=True)


def _grouped_args(groups: int = 2, n: int = 64, k: int = 128, rows: int = 0):
    w = torch.zeros(groups, n, k // 2, dtype=torch.uint8)
    s = torch.zeros(groups, n, k // 16, dtype=torch.uint8)
    a = torch.zeros(rows, k, dtype=torch.bfloat16)
    tile_expert = torch.zeros(max(rows, 1), dtype=torch.int32)
    return a, tile_expert, w, s


@pytest.mark.parametrize("epilogue,bad_shape", [
    ("none", (2, 65)),
    ("none", (3, 64)),
    ("none", (2, 2, 32)),  # a gate/up form for a plain GEMM
    ("swiglu", (2, 1, 64)),  # a one-half form for the SwiGLU GEMM
    ("swiglu", (2, 2, 31)),
    ("row_scale", (2,)),  # a per-expert scale must come as a view [G, 1, N]
    ("none", ()),
])
def test_grouped_gemm_rejects_wrong_global_shape(epilogue, bad_shape):
    a, tile_expert, w, s = _grouped_args()
    halves = 2 if epilogue == "swiglu" else 1
    out = torch.zeros(0, 64 // halves, dtype=torch.bfloat16)
    expected = (r"w_global must be fp32 \[G, N\] = \[2, 64\] or \[G, H2, N/H2\] = "
                rf"\[2, {halves}, {64 // halves}\] \('{epilogue}' epilogue\), got")
    with pytest.raises(ValueError, match=expected):
        linear_cuda.run_gemm(_grouped_plan(epilogue), a, w, s, _positive(*bad_shape), out,
                             tile_expert=tile_expert)


def test_grouped_gemm_rejects_non_fp32_global():
    a, tile_expert, w, s = _grouped_args()
    out = torch.zeros(0, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="w_global must be fp32"):
        linear_cuda.run_gemm(_grouped_plan("none"), a, w, s, _positive(2, 1, 64).half(), out,
                             tile_expert=tile_expert)


@pytest.mark.parametrize("epilogue", ["none", "swiglu", "row_scale"])
def test_grouped_gemm_accepts_every_global_form(epilogue):
    """``[G, N]``, a ``[G, H2, N/H2]`` view with stride 0 and the compact ``[G, H2, N/H2]``
    pass the check (zero rows: nothing launches)."""
    a, tile_expert, w, s = _grouped_args()
    halves = 2 if epilogue == "swiglu" else 1
    out = torch.zeros(0, 64 // halves, dtype=torch.bfloat16)
    forms = [_positive(2, 64), _positive(2, halves, 64 // halves),
             _positive(2, halves, 1).expand(2, halves, 64 // halves)]
    for w_global in forms:
        linear_cuda.run_gemm(_grouped_plan(epilogue), a, w, s, w_global, out,
                             tile_expert=tile_expert, row_scale=torch.ones(0))


@pytest.mark.parametrize("epilogue", ["swiglu", "row_scale"])
def test_unchecked_launch_passes_what_the_checked_one_does(monkeypatch, epilogue):
    """``run_gemm(check=False)`` (the ops' path, arguments already in the binaries' form)
    hands the binary the same twelve arguments as the checked path builds from the plain ones."""
    plan = _grouped_plan(epilogue)
    calls = []
    monkeypatch.setattr(linear_cuda, "compiled",
                        lambda cfg: lambda *args: calls.append(args))
    rows = 2 * plan.block_m
    a = torch.randn(rows, 128).to(torch.bfloat16)
    w = torch.randint(0, 256, (2, 64, 64), dtype=torch.uint8)
    s = torch.full((2, 64, 8), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn)
    g = _positive(2, 2) if epilogue == "swiglu" else _positive(2)
    tile_expert = torch.tensor([0, 1], dtype=torch.int32)
    out = torch.empty(rows, 32 if epilogue == "swiglu" else 64, dtype=torch.bfloat16)
    row_scale = torch.rand(rows) if epilogue == "row_scale" else None
    kw = dict(tile_expert=tile_expert, tile_rows=torch.tensor([plan.block_m, 1], dtype=torch.int32),
              row_scale=row_scale, swiglu_limit=7.0)
    weights = (w, s, g)
    if epilogue == "swiglu":
        w3, s3, gv = linear_cuda.kernel_weight(w, s) + (gate_up_global_view(g, 32),)
    else:
        w3, s3, gv = linear_cuda.kernel_weight(w, s) + (linear_cuda.global_rows(g, w),)
    linear_cuda.run_gemm(plan, a, *weights[:2], gv, out, **kw)
    linear_cuda.run_gemm(plan, a, w3, s3, gv, out, check=False, **kw)
    checked, unchecked = calls
    assert len(checked) == len(unchecked) == 12
    for x, y in zip(checked, unchecked, strict=True):
        if isinstance(x, torch.Tensor):
            assert (x.data_ptr(), x.shape, x.stride(), x.dtype) == (
                y.data_ptr(), y.shape, y.stride(), y.dtype)
        else:
            assert x == y
