"""The dispatch policy (:mod:`nvfp4_ops.kernels.dispatch`) on the CPU: which family serves which
tile, the fallbacks, the MoE plan, the weight orders, and the import structure (no cycles)."""

from __future__ import annotations

import ast
import functools
import math
import os
from pathlib import Path

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

PACKAGE = Path(__file__).resolve().parents[1] / "nvfp4_ops"


def _module_imports() -> dict[str, set[str]]:
    """``nvfp4_ops`` module -> the ``nvfp4_ops`` modules it imports (anywhere in its body:
    function-level imports count, they are edges too), from the source with ``ast``."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_pkg)
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in modules.items():
        edges = set()
        package = name if is_pkg else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # ``from pkg import mod`` imports mod; ``from mod import name`` imports mod
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            for t in targets:
                # the longest known module the import names
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def test_no_import_cycle_among_package_modules():
    graph = _module_imports()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_layers_point_down():
    """The compile cache imports nothing of the package; the kernels never import the ops,
    the warm-up, the references or the dispatch's callers; the dispatch imports no launcher;
    the references never import the kernels; the orders stand on the format alone; no product
    module imports the test helpers (only the ``check`` command, a self-test, does)."""
    graph = _module_imports()
    assert graph["nvfp4_ops._compile"] <= {"nvfp4_ops._env"}
    for name, edges in graph.items():
        if name.startswith("nvfp4_ops.reference"):
            assert not any(e.startswith("nvfp4_ops.kernels") for e in edges), (name, edges)
        if name.startswith("nvfp4_ops.orders"):
            assert edges <= {"nvfp4_ops.format", "nvfp4_ops.orders", "nvfp4_ops.orders.wperm",
                             "nvfp4_ops.orders.wfrag", "nvfp4_ops.orders.kperm"}, (name, edges)
        if name not in ("nvfp4_ops.testing", "nvfp4_ops.cli.check"):
            assert "nvfp4_ops.testing" not in edges, (name, edges)
    for name, edges in graph.items():
        if name.startswith("nvfp4_ops.kernels"):
            assert not any(e.startswith(("nvfp4_ops.ops", "nvfp4_ops._warmup", "nvfp4_ops.cli",
                                         "nvfp4_ops.reference"))
                           for e in edges), (name, edges)
        if name.startswith("nvfp4_ops.kernels.cute") or name.startswith(
                "nvfp4_ops.kernels.triton"):
            assert not edges & {"nvfp4_ops.kernels.dispatch", "nvfp4_ops.kernels.linear_cuda",
                                "nvfp4_ops.kernels.moe_cuda"}, (name, edges)
    assert not graph["nvfp4_ops.kernels.dispatch"] & {"nvfp4_ops.kernels.linear_cuda",
                                                      "nvfp4_ops.kernels.moe_cuda"}


def test_the_cycle_test_can_fail(tmp_path, monkeypatch):
    """Negative control: two modules importing each other are reported."""
    pkg = tmp_path / "nvfp4_ops"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from nvfp4_ops import b\n")
    (pkg / "b.py").write_text("def f():\n    from nvfp4_ops.a import x\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", pkg)
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_import_cycle_among_package_modules()


# ---------------------------------------------------------------------------- the rules

cutlass = pytest.importorskip("cutlass")
from nvfp4_ops.kernels import dispatch as D  # noqa: E402

W = D.WeightOrder


def _plan(n, k, bm, epilogue="none", **kw):
    return D.plan_gemm(n, k, bm, epilogue=epilogue, **kw)


def test_families_and_fallbacks():
    assert _plan(7168, 18432, 8).family == "stream"
    assert _plan(7168, 18432, 16).family == "mma"
    assert _plan(4096, 4096, 16, "swiglu", grouped=True).family == "wgmma"
    assert _plan(7168, 18432, 256).family == "wgmma"
    # N_out = 80: not a multiple of 64 -> dense falls back to mma.sync's largest tile
    plan = _plan(80, 1024, 128)
    assert plan.family == "mma" and plan.block_m == 64
    # ... but a grouped tile cannot change (the routing padded to it): refused up front
    with pytest.raises(ValueError, match="no kernel covers grouped"):
        _plan(80, 1024, 128, grouped=True)
    assert _plan(80, 1024, 16, grouped=True).family == "mma"  # mma.sync has 16-row tiles
    # K % 256 != 0: the streamed kernel refuses, mma.sync takes the 8-token tile
    assert _plan(4096, 1152, 8).family == "mma"
    assert [D.dense_block_m(m) for m in (1, 9, 17, 33, 65, 256, 257, 512)] == \
        [8, 16, 32, 64, 128, 128, 256, 256]
    # shapes no kernel covers run the reference
    assert D.plan_linear(100, 4096, 1) is None and D.plan_linear(4096, 4000, 1) is None
    assert D.plan_mlp(4096, 100, 1) is None


def test_permuted_orders_and_the_moe_plan():
    """Permuted activations: the MoE's WGMMA tiles (32-block order) and streamed 8-token tiles
    (pair order); the order each plan reads is the one the gather writes."""
    for bm in D.BLOCK_MS:
        for n, k, epi in ((4096, 4096, "swiglu"), (4096, 2048, "row_scale")):
            for m_tiles in (None, 1, 9):
                plan = _plan(n, k, bm, epi, grouped=True, m_tiles=m_tiles, permuted=True)
                assert plan.config.permuted and plan.config.grouped and plan.block_m == bm
                assert plan.act_order == ("pair" if bm == 8 else "kperm")
                assert plan.family == ("stream" if bm == 8 else "wgmma")
                assert _plan(n, k, bm, epi, grouped=True, m_tiles=m_tiles).act_order == \
                    "natural"
    # the pair-order decode gate/up keeps the persistent choice at few token tiles
    assert _plan(4096, 4096, 8, "swiglu", grouped=True, m_tiles=6, permuted=True).config.ctas
    assert not _plan(4096, 4096, 8, "swiglu", grouped=True, m_tiles=9,
                     permuted=True).config.ctas
    # the decode down GEMM: 4 consumer warps and 3 stages at few token tiles where the rank
    # expects a few experts' rows (one EP 4 or EP 8 rank at T = 1), else 2 warps and 2
    # stages; never persistent
    down = {(m, few): _plan(7168, 3072, 8, "row_scale", grouped=True, m_tiles=m,
                            permuted=True, few_rows=few).config
            for m in (1, D.PERSIST_MAX_TILES, D.PERSIST_MAX_TILES + 1) for few in (False, True)}
    assert {key: (c.warps_k, c.stages, c.ctas) for key, c in down.items()} == {
        (1, False): (2, 2, 0), (1, True): (4, 3, 0), (8, False): (2, 2, 0), (8, True): (4, 3, 0),
        (9, False): (2, 2, 0), (9, True): (2, 2, 0)}
    for t, e, ge, warps in ((1, 384, -1, 2), (1, 48, 384, 4), (1, 96, 384, 4), (1, 192, 384, 2),
                            (2, 48, 384, 2), (8, 48, 384, 2)):
        plan = D.plan_moe(t, 6, e, 7168, 3072, global_num_experts=ge)
        assert plan.down.config.warps_k == warps, (t, e, ge)
        assert plan.gate_up.config.warps_k == 4
    for kw in (dict(block_m=8, grouped=False), dict(block_m=128, grouped=False),
               dict(block_m=8, grouped=True, k=1152)):  # K % 256: mma.sync fallback
        kw.setdefault("k", 4096)
        bm = kw.pop("block_m")
        with pytest.raises(ValueError, match="k-permuted"):
            D.plan_gemm(4096, kw.pop("k"), bm, epilogue="swiglu", permuted=True, **kw)


def test_moe_down_tiles_capped_on_expert_parallel_ranks():
    """The down GEMM walks at most ``DOWN_TILES_CAP`` token tiles per feature tile only past
    decode, where the grid bounds twice the cap and the rank expects at most a quarter of the
    slots (an EP 8 rank at T = 128); never at EP 1 or 2, at decode or for gate/up."""
    cap = D.DOWN_TILES_CAP
    for (e, h, i), ep, t, capped in (((256, 4096, 2048), 8, 128, True),
                                     ((384, 7168, 3072), 8, 128, True),
                                     ((256, 4096, 2048), 8, 32, False),
                                     ((256, 4096, 2048), 8, 1, False),
                                     ((256, 4096, 2048), 1, 128, False),
                                     ((256, 4096, 2048), 2, 128, False),
                                     ((384, 7168, 3072), 4, 256, True),
                                     ((384, 7168, 3072), 1, 256, False)):
        plan = D.plan_moe(t, 6, e // ep, h, i, global_num_experts=e)
        assert plan.down.config.ctas == (h // 16 * cap if capped else 0), (e, ep, t)
        assert plan.gate_up.config.ctas == 0 or t == 1
    assert D.moe_down_tiles_cap(2 * cap * 8 - 8, 8, 96.0, 768) == 0  # grid below twice the cap
    assert D.moe_down_tiles_cap(2 * cap * 8, 8, 192.0, 768) == cap  # a quarter of the slots
    assert D.moe_down_tiles_cap(2 * cap * 8, 8, 193.0, 768) == 0
    # MXFP4's down GEMM too (its UE8M0 scales change the stage bytes, not the walk)
    assert D.plan_moe(128, 6, 32, 4096, 2048, global_num_experts=256, order=W.WPERM,
                      mx=True).down.config.ctas == 256 * cap
    # warm-up reaches the capped down GEMM
    reach = D.reachable_plans(moes=[(4096, 2048, D.WeightOrder.WPERM, False)])
    assert any(p.config.epilogue == "row_scale" and getattr(p.config, "ctas", 0) == 256 * cap
               for p in reach)


def test_moe_plan_is_asked_once_and_consistent():
    """The MoE's plan: the tile of the mean rows per expert that both GEMMs cover, its
    family's permuted order, the padded rows, and two GEMM plans that agree with it."""
    flash = [D.plan_moe(t, 6, 256, 4096, 2048) for t in (1, 128, 512, 4096, 16384)]
    assert [p.block_m for p in flash] == [8, 8, 16, 128, 256]
    assert [p.act_order for p in flash] == ["pair", "pair", "kperm", "kperm", "kperm"]
    for p in flash:
        assert p.gate_up.act_order == p.down.act_order == p.act_order
        assert p.gate_up.block_m == p.down.block_m == p.block_m
        assert p.gate_up.config.epilogue == "swiglu" and p.down.config.epilogue == "row_scale"
        assert p.gate_up.config.pdl and p.down.config.pdl
        assert p.num_rows % p.block_m == 0
    assert D.plan_moe(1, 6, 256, 4096, 2048).num_rows == 48  # 6 slots + 6 * 7 padding
    # tiny (H = 256, I = 128): the down GEMM (K = 128) is not streamed at 8 -> natural there
    assert D.plan_moe(3, 6, 64, 256, 128).act_order == "natural"
    assert [D._grouped_permuted(256, 128, bm) for bm in D.BLOCK_MS] == [False] + [True] * 5
    assert D.plan_moe(3, 6, 64, 200, 128) is None  # H % 128: the reference
    with pytest.raises(ValueError, match="not wfrag"):
        D.plan_moe(3, 6, 64, 4096, 2048, order=W.WFRAG)
    wp = D.plan_moe(8, 6, 256, 4096, 2048, order=W.WPERM)
    assert wp.gate_up.config.order is W.WPERM and wp.down.config.order is W.WPERM
    assert D.moe_wperm_supported(4096, 2048) and D.moe_wperm_supported(7168, 3072)
    assert not D.moe_wperm_supported(256, 128)


def test_moe_block_m_rule():
    whole = functools.partial(D.moe_block_m, flex=False)
    for rule in (D.moe_block_m, whole):
        assert rule(6, 256) == 8
        assert rule(6 * 128, 256) == 8
        assert rule(6 * 512, 256) == 16
        assert rule(6 * 4096, 256) == 128
        assert rule(6 * 16384, 256) == 256
        assert all(rule(n, 256) in D.BLOCK_MS for n in range(0, 10**5, 997))
        assert rule(6 * 512, 384) == 16
        assert rule(6 * 256, 256) == 16
    # whole-width tiles: the cells where the measured best tile is larger than the mean rows
    # per expert (benchmarks/results/moe_tiles_h200.log): V4-Pro T = 512 / 1024 / 2048,
    # V4-Flash T = 256
    assert whole(6 * 1024, 384) == 32
    assert whole(6 * 2048, 384) == 64
    assert whole(6 * 4096, 384) == 64
    assert whole(6 * 1024, 256) == 32
    # flexible widths make a larger tile's partial last tile cheap: the tiles measured best
    # with them (benchmarks/results/moe_flex_h200.log)
    assert D.moe_block_m(6 * 1024, 256) == 64
    assert D.moe_block_m(6 * 2048, 384) == 64
    assert D.moe_block_m(6 * 4096, 384) == 128
    assert D.moe_block_m(6 * 16384, 384) == 256


def test_policy_never_takes_the_32_row_tile():
    """The op's policy chooses among ``MOE_POLICY_TILES``: the 64-row tile run at its narrow
    widths took less time than the 32-row tile where the pricing had tied them (V4-Pro EP 1
    T = 1024, V4-Flash EP 1 T = 768 take the 64-row tile now); the whole-width rule (tools)
    still takes 32."""
    assert 32 in D.BLOCK_MS and 32 not in D.MOE_POLICY_TILES
    assert set(D.MOE_POLICY_TILES) < set(D.BLOCK_MS)
    for experts, global_experts in ((256, 256), (384, 384), (32, 256), (48, 384)):
        for t in range(1, 20000, 37):
            slots = D.local_slots(6 * t, experts, global_experts)
            assert D.moe_block_m(slots, experts, hot=2 * slots >= 6 * t) != 32, (experts, t)
    assert D.plan_moe(1024, 6, 384, 7168, 3072).block_m == 64
    assert D.plan_moe(768, 6, 256, 4096, 2048).block_m == 64
    assert D.moe_block_m(6 * 1024, 384, flex=False) == 32
    # the tools can still force the 32-row tile
    assert D.plan_moe(1024, 6, 384, 7168, 3072, block_m=32).block_m == 32


def test_tile_choice_under_another_cost_table():
    """The pricing takes the cost table as an argument (``costs``, default
    ``MOE_TILE_COST``): a candidate table changes what would be planned, and the dispatch's
    own table is left alone (what ``benchmarks/dev/moe_tile_model.py --fit`` relies on)."""
    before = dict(D.MOE_TILE_COST)
    slots, experts = 6 * 2048, 256  # 48 rows per expert: the 64-row tile today
    assert D.moe_block_m(slots, experts) == D.moe_block_m(slots, experts, True, before) == 64
    assert D.moe_block_m(slots, experts, False) == 64
    cheap_128 = {**before, 128: before[32]}  # a whole 128-row tile at a 32-row tile's cost
    assert D.moe_block_m(slots, experts, False, cheap_128) == 128
    assert D.expert_cost(70, 128, 32, cheap_128) == D.moe_width_cost(96, cheap_128)
    assert D.expected_cost(48.0, 128, False, cheap_128) < D.expected_cost(48.0, 128, False)
    assert D.MOE_TILE_COST == before


def test_flexible_width_cost():
    """A partial last tile is priced at its width rounded up to the tile's granularity
    (``MOE_FLEX``), linear between the measured tiles; whole tiles otherwise."""
    assert D.moe_width_cost(64) == D.MOE_TILE_COST[64]
    assert D.moe_width_cost(96) == pytest.approx((D.MOE_TILE_COST[64]
                                                  + D.MOE_TILE_COST[128]) / 2)
    with pytest.raises(ValueError, match="width 300"):
        D.moe_width_cost(300)
    assert D.expert_cost(70, 128, 32) == D.moe_width_cost(96)
    assert D.expert_cost(128, 128, 32) == D.MOE_TILE_COST[128]
    assert D.expert_cost(129, 128, 32) == D.MOE_TILE_COST[128] + D.moe_width_cost(32)
    assert D.expert_cost(70, 128) == D.MOE_TILE_COST[128]
    assert D.expert_cost(0, 128, 32) == 0.0
    # without a granularity (8-32 tiles, or flex off) the expectation is whole tiles
    for bm in (8, 16, 32):
        assert D.expected_cost(20.0, bm) == pytest.approx(
            D.expected_tiles(20.0, bm) * D.MOE_TILE_COST[bm], rel=1e-12)
    assert D.expected_cost(60.0, 128, flex=False) == pytest.approx(
        D.expected_tiles(60.0, 128) * D.MOE_TILE_COST[128], rel=1e-12)
    assert D.expected_cost(60.0, 128) < D.expected_cost(60.0, 128, flex=False)


def test_narrow_widths_priced_at_32_where_a_hot_class_may_run():
    """The 64-row tile runs widths of 16 (``MOE_FLEX``) but where a hot class may take the hot
    experts the tile choice prices its partial tile at 32 or more (``MOE_PRICED_WIDTH_MIN``):
    T = 512 at EP 1 keeps the 16-row tile, where the 64-row tile at width 16 measured slower;
    one EP 8 rank (no hot class) prices width 16 and takes the 64-row tile there (DESIGN.md
    section 8)."""
    assert D.MOE_FLEX[64] == 16 and D.MOE_PRICED_WIDTH_MIN == 32
    assert D.moe_priced_granularity(64) == 32
    assert D.moe_priced_granularity(64, hot=False) == 16
    assert D.moe_priced_granularity(256, hot=False) == D.MOE_FLEX[256]
    assert D.expected_cost(12.0, 64, hot=False) < D.expected_cost(12.0, 64)
    flash_ep8 = D.plan_moe(512, 6, 32, 4096, 2048, global_num_experts=256)
    assert flash_ep8.block_m == 64 and flash_ep8.hot is None
    assert D.plan_moe(1024, 6, 48, 7168, 3072, global_num_experts=384).block_m == 64
    assert D.plan_moe(1024, 6, 384, 7168, 3072).block_m == 64
    assert D.moe_priced_granularity(128) == D.MOE_FLEX[128]
    assert D.moe_priced_granularity(256) == D.MOE_FLEX[256]
    assert D.moe_priced_granularity(16) == D.moe_priced_granularity(8) == 0
    assert D.expected_cost(10.0, 64) == pytest.approx(sum(
        p * D.expert_cost(x, 64, 32) for x, p in D._poisson(10.0)), rel=1e-12)
    for sizes in ((512, 6, 256, 4096, 2048), (512, 6, 384, 7168, 3072)):
        plan = D.plan_moe(*sizes)
        assert plan.block_m == 16, (sizes, plan.block_m)
    flash = D.plan_moe(2048, 6, 256, 4096, 2048)
    assert flash.block_m == 64 and flash.gate_up.config.flex == flash.down.config.flex == 16


def test_flexible_width_in_the_moe_plan():
    """The op's plan runs its 64-256-row tiles (two or more row warpgroups) at flexible
    width, hot tile included, and its 128-row tiles (and V4-Pro's 64-row ones, K >= 3072)
    with four row warpgroups (``GROUPED_ROW_WGS``); the 8-32 tiles, ``flex=False`` plans and
    dense GEMMs never run flexible widths."""
    seen = set()
    for t in (1, 128, 512, 1024, 2048, 4096, 16384):
        for flex in (True, False):
            plan = D.plan_moe(t, 6, 384, 7168, 3072, flex=flex)
            gemms = [(plan.block_m, plan.gate_up), (plan.block_m, plan.down)]
            if plan.hot is not None:
                gemms += [(plan.hot.routing.block_m, g)
                          for g in (plan.hot.gate_up, plan.hot.down)]
            for bm, g in gemms:
                want = D.MOE_FLEX.get(bm, 0) if flex else 0
                assert getattr(g.config, "flex", 0) == want, (t, flex, bm)
                if bm >= 64:
                    assert g.config.row_wgs == D.grouped_row_wgs(bm, g.config.k), (t, bm)
                    seen.add((bm, g.config.row_wgs))
    assert seen == {(128, 4), (256, 2), (64, 4)}, seen
    assert D.grouped_row_wgs(64, 3072) == 4 and D.grouped_row_wgs(64, 2048) == 2
    flash = D.plan_moe(2048, 6, 256, 4096, 2048)  # V4-Flash: the down GEMM (K = 2048) keeps two
    assert flash.block_m == 64 and flash.down.config.row_wgs == 2
    assert flash.gate_up.config.row_wgs == 4 and D.grouped_row_wgs(128, 64) == 4
    assert D.plan_moe(4096, 6, 384, 7168, 3072).block_m == 128
    assert D.plan_moe(4096, 6, 384, 7168, 3072, flex=False).block_m == 64
    assert not D.plan_gemm(7168, 18432, 128, m_tiles=4).config.flex
    assert not D.plan_gemm(4096, 4096, 128, epilogue="swiglu", grouped=True).config.flex


def test_expected_tiles_is_the_poisson_mean_of_the_ceiling():
    assert D.expected_tiles(0.0, 8) == 0.0
    # a tile larger than any count: P(X > 0)
    for mean in (0.5, 3.0, 20.0):
        assert D.expected_tiles(mean, 10**6) == pytest.approx(1 - math.exp(-mean), rel=1e-9)
    # one-row tiles: E[X]
    assert D.expected_tiles(37.0, 1) == pytest.approx(37.0, rel=1e-9)
    # mean 8 over 8-row tiles: ~41 % of the experts need a second tile
    assert 1.4 < D.expected_tiles(8.0, 8) < 1.5
    assert D.expected_tiles(200.0, 64) == pytest.approx(
        sum(math.exp(x * math.log(200.0) - 200.0 - math.lgamma(x + 1)) * -(-x // 64)
            for x in range(1, 600)), rel=1e-9)
    # every size moe_supported accepts (H, I multiples of 128) has a kernel at every tile
    for hidden_size, inter in [(4096, 2048), (7168, 3072), (256, 128), (384, 640)]:
        for bm in D.BLOCK_MS:
            assert D._moe_tile(bm, hidden_size, inter) == bm


def test_moe_tile_follows_the_ranks_share_of_the_slots():
    """Under expert parallelism the tile is sized for the slots expected on this rank (its
    share of the experts), not for all T * k: one rank of EP 8 gets the tile of the whole op
    at the same T, except where the whole op's choice counts on a hot class (T = 512: the
    64-row tile priced at width 16 on the rank). The padded rows still bound every slot (all
    may be local)."""
    for t in (1, 8, 128, 512, 2048, 4096, 16384):
        whole = D.plan_moe(t, 6, 256, 4096, 2048)
        rank = D.plan_moe(t, 6, 32, 4096, 2048, global_num_experts=256)
        assert rank.block_m == (64 if t == 512 else whole.block_m), t
        assert rank.num_rows >= t * 6 and rank.num_rows % rank.block_m == 0
    assert D.plan_moe(512, 6, 32, 4096, 2048).block_m == 128  # count unknown: all local
    assert D.plan_moe(512, 6, 32, 4096, 2048, global_num_experts=32).block_m == 128
    assert D.local_slots(3072, 32, 256) == 384
    assert D.local_slots(3072, 32, -1) == D.local_slots(3072, 32, 16) == 3072
    # the tiles an EP rank picks are among those warm-up compiles (any expert count)
    reach = {p.config.name for p in D.reachable_plans(moes=[(4096, 2048, W.CHECKPOINT, False)])}
    for t in (1, 128, 512, 4096, 16384):
        for e in (32, 64, 128):
            plan = D.plan_moe(t, 6, e, 4096, 2048, global_num_experts=256)
            assert {plan.gate_up.config.name, plan.down.config.name} <= reach, (t, e)


def test_hot_tile_class_rule():
    """A hot tile wherever the base tile is a 16-128-row WGMMA tile, ``N`` leaves room for a
    hot expert and the rank holds at least half of the experts; its rule (min rows, costs)
    comes from MOE_TILE_COST; the base GEMMs then run beside the hot ones (``sibling``), and
    every config is among those warm-up compiles. The padded rows hold both regions."""
    from nvfp4_ops.kernels.triton.moe_routing import hot_region_rows, padded_rows

    assert [D.moe_hot_class(bm) and D.moe_hot_class(bm).block_m
            for bm in D.BLOCK_MS] == [None, 128, 128, 256, 256, None]
    for bm, hot in D.MOE_HOT_TILE.items():
        c = D.moe_hot_class(bm)
        assert c.min_rows >= hot // 2
        rows = c.min_rows  # at min_rows the hot tile is cheaper, one row less is not always
        assert -(-rows // hot) * c.cost < -(-rows // bm) * c.base_cost
    reach = {p.config.name for p in D.reachable_plans(moes=[(4096, 2048, W.WPERM, False),
                                                            (7168, 3072, W.WPERM, False)])}
    for h, i, e in ((4096, 2048, 256), (7168, 3072, 384)):
        for t in (1, 8, 128, 512, 1024, 2048, 4096, 16384):
            plan = D.plan_moe(t, 6, e, h, i, order=W.WPERM)
            single = D.plan_moe(t, 6, e, h, i, order=W.WPERM, hot=False)
            assert single.hot is None and single.block_m == plan.block_m
            want_hot = plan.block_m in D.MOE_HOT_TILE
            assert (plan.hot is not None) == want_hot, (h, t, plan.block_m)
            if not want_hot:
                assert plan == single
                continue
            assert plan.gate_up.config.sibling and plan.down.config.sibling
            assert not plan.hot.gate_up.config.sibling
            assert plan.hot.gate_up.act_order == plan.act_order == "kperm"
            names = {plan.gate_up.config.name, plan.down.config.name,
                     plan.hot.gate_up.config.name, plan.hot.down.config.name}
            assert names <= reach, (h, t)
            n = t * 6
            assert plan.num_rows == padded_rows(n, e, plan.block_m, plan.hot.routing)
            assert plan.num_rows >= single.num_rows + 0 and plan.num_rows % 256 in (0, 128)
            assert hot_region_rows(n, e, plan.hot.routing) <= plan.num_rows
            # one rank of EP 8: one tile for all (the hot grid would be sized for 8x its share)
            rank = D.plan_moe(t, 6, e // 8, h, i, global_num_experts=e, order=W.WPERM)
            assert rank.hot is None
            two = D.plan_moe(t, 6, e // 2, h, i, global_num_experts=e, order=W.WPERM)
            assert (two.hot is not None) == (two.block_m in D.MOE_HOT_TILE)


@pytest.mark.parametrize("mx", [False, True])
def test_unrolled_k_loop_rule(mx):
    """The grouped WGMMA GEMMs of at least GROUPED_UNROLL_MIN_WEIGHTS weights per expert (both
    of V4-Pro's) unroll their k loop at every T, EP slice and tile, hot tiles and MXFP4
    included; V4-Flash's only as base tiles beside a hot one (but the 64-row two-warpgroup
    tile); the streamed decode tiles and every dense GEMM stay rolled; each unrolled config is
    among those warm-up compiles."""
    order = W.WPERM
    reach = {p.config.name: p.config for p in D.reachable_plans(
        moes=[(4096, 2048, order, mx), (7168, 3072, order, mx)])}
    assert 4096 * 4096 < D.GROUPED_UNROLL_MIN_WEIGHTS <= 7168 * 3072
    seen = set()
    for h, i, e, want in ((4096, 2048, 256, False), (7168, 3072, 384, True)):
        for t in (1, 8, 128, 256, 512, 2048, 4096, 16384):
            for local, total in ((e, -1), (e // 8, e)):
                plan = D.plan_moe(t, 6, local, h, i, global_num_experts=total, order=order,
                                  mx=mx)
                gemms = [plan.gate_up, plan.down]
                gemms += [plan.hot.gate_up, plan.hot.down] if plan.hot else []
                for g in gemms:
                    assert g.config.name in reach, (h, t, local, g.config.name)
                    if g.family == "wgmma":
                        c = g.config
                        beside = (c.overlap == "beside"
                                  and (c.block_m, c.row_wgs) not in D.UNROLL_HALVES_OCCUPANCY)
                        assert c.overlap != "beside" or plan.hot
                        assert c.unroll == (want or beside), (h, t, local, c.name)
                        seen.add((c.unroll, c.block_m))
                    else:
                        assert not getattr(g.config, "unroll", False)
    # the rule reached every grouped WGMMA tile of both shapes
    assert {bm for u, bm in seen if u} == {bm for u, bm in seen if not u} == {16, 64, 128, 256}
    # the tile kept rolled beside a hot one is V4-Flash's 64-row two-warpgroup down tile
    assert D.UNROLL_HALVES_OCCUPANCY == {(64, 2)}
    assert not D.grouped_unroll(4096, 2048, 64, 2, beside=True)
    assert D.grouped_unroll(4096, 2048, 64, 4, beside=True)
    assert D.grouped_unroll(7168, 3072, 64, 2) and not D.grouped_unroll(4096, 2048, 128, 4)
    dense = D.reachable_plans(linears=[(7168, 18432, False, W.CHECKPOINT),
                                       (7168, 18432, False, W.WFRAG)],
                              mlps=[(7168, 3072, W.CHECKPOINT)])
    assert not any(getattr(p.config, "unroll", False) for p in dense)


def test_plans_are_frozen_and_configs_built_once():
    plan = D.plan_linear(7168, 18432, 16, order=W.WFRAG)
    with pytest.raises(AttributeError):
        plan.family = "mma"  # frozen
    assert plan is D.plan_linear(7168, 18432, 16, order=W.WFRAG) or plan == D.plan_linear(
        7168, 18432, 16, order=W.WFRAG)
    assert plan.streamk and plan.weight_order is W.WFRAG and plan.act_order == "natural"
    assert D.plan_of_config(plan.config) == plan


#: kernel-config fields no reachable plan sets away from their default, and why they stay
CONFIG_FIELDS_NOT_DISPATCHED = {
    "arch": "the compile target; sm_90a is the only one built (the field keys the cache)",
}


def test_every_config_field_is_set_by_some_reachable_plan():
    """The house rule "no dead options": each option of the three kernel configs (the fields
    after the problem's own, :class:`GemmProblem`) takes a value other than its default in some
    plan the dispatch reaches (the V4 shapes and the tiny one
    in every weight order the ops accept, MXFP4 included, and dense linears with and without
    bias: K % 512 == 256 and N_out % 64 != 0 reach the fallback tiles), or is listed in
    CONFIG_FIELDS_NOT_DISPATCHED with its reason."""
    import dataclasses

    from nvfp4_ops.kernels.cute import w4a16_gemm, w4a16_stream, w4a16_wgmma
    from nvfp4_ops.kernels.cute.gemm_interface import GemmProblem
    from nvfp4_ops.shapes import get_shape

    linears, mlps, moes = [], [], []
    for name in ("v4-flash", "v4-pro", "tiny"):
        s = get_shape(name)
        mlps += [(s.hidden, s.shared_intermediate, order) for order in (W.CHECKPOINT, W.WFRAG)]
        moes.append((s.hidden, s.intermediate, W.CHECKPOINT, False))
        if D.moe_wperm_supported(s.hidden, s.intermediate):
            moes.append((s.hidden, s.intermediate, W.WPERM, False))
        if D.moe_mx_supported(s.hidden, s.intermediate):
            moes.append((s.hidden, s.intermediate, W.WPERM, True))
    for n, k in ((7168, 18432), (18432, 7168), (4096, 1280), (96, 1024)):
        linears += [(n, k, bias, order) for bias in (False, True)
                    for order in (W.CHECKPOINT, W.WFRAG)]
    plans = D.reachable_plans(linears=linears, mlps=mlps, moes=moes)
    problem = {f.name for f in dataclasses.fields(GemmProblem)}
    dead = []
    for cls in (w4a16_stream.StreamConfig, w4a16_gemm.GemmConfig, w4a16_wgmma.WgmmaConfig):
        reached = [p.config for p in plans if type(p.config) is cls]
        assert reached, cls.__name__
        for field in dataclasses.fields(cls):
            if field.name in problem or field.name in CONFIG_FIELDS_NOT_DISPATCHED:
                continue
            if {getattr(c, field.name) for c in reached} <= {field.default}:
                dead.append(f"{cls.__name__}.{field.name}")
    assert not dead, f"config fields no reachable plan sets: {dead}"


@pytest.mark.parametrize("num_tokens", [1, 512, 4096])
def test_moe_plan_says_once_whether_the_chain_overlaps(num_tokens):
    """``MoEPlan.chained`` is the one switch for the chain's launch overlap: the Triton kernels
    follow it (``moe_forward``) and so does every GEMM whose family can overlap (``after``, or
    ``beside`` for the base tile next to a hot one); without it nothing overlaps."""
    flash = (num_tokens, 6, 256, 4096, 2048)
    on, off = D.plan_moe(*flash), D.plan_moe(*flash, chained=False)
    assert on.chained and not off.chained
    for plan, want in ((on, {"after", "beside"}), (off, {"none"})):
        gemms = [plan.gate_up, plan.down]
        if plan.hot is not None:
            gemms += [plan.hot.gate_up, plan.hot.down]
        assert {g.config.overlap for g in gemms} <= want
        assert all(g.config.pdl == plan.chained for g in gemms)
    if on.hot is not None:  # the base GEMMs run beside the hot ones
        assert on.gate_up.config.sibling and not on.hot.gate_up.config.sibling
