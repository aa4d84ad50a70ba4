"""MoE routing preparation and combine (Triton) against plain Python loops.

On a machine without CUDA the Triton kernels run in Triton's interpreter on CPU tensors
(``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` before triton is imported); with a GPU the
same checks run on the compiled kernels with CUDA tensors.
"""

from __future__ import annotations

import os

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # set by conftest.py without CUDA


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def kernels(request):
    """(device, routing module, combine module)."""
    if request.param == "cpu" and not INTERPRETED:
        pytest.skip("compiled Triton kernels need CUDA tensors (CPU runs use the interpreter)")
    from nvfp4_ops.kernels.triton import moe_combine, moe_routing

    return request.param, moe_routing, moe_combine


@pytest.fixture(params=["fused", "fused_one_warp", "direct", "multi"])
def routing_path(request, monkeypatch):
    """Run a routing test through the one-CTA kernel (at its warps and at one warp, compiled
    only: the interpreter has no warps), through the direct kernel where the slots fit it
    (the one-CTA kernel elsewhere) and through the four-launch path."""
    from nvfp4_ops.kernels.triton import moe_routing

    if request.param == "multi":
        monkeypatch.setattr(moe_routing, "FUSED_MAX_SLOTS", -1)
    monkeypatch.setattr(moe_routing, "DIRECT_ROUTING", request.param == "direct")
    if request.param == "fused_one_warp":
        if INTERPRETED:
            pytest.skip("Triton's interpreter has no warps: the same run as 'fused'")
        monkeypatch.setattr(moe_routing, "FUSED_NUM_WARPS", 1)
    return request.param


def reference_routing(topk_ids: torch.Tensor, num_experts: int, expert_start: int,
                      block_m: int, num_rows: int = 0, hot=None):
    """Python loops: per local expert its slots in order and its segment ``[start, end)``:
    base experts padded to block_m upwards from row 0, hot ones (``hot``: a ``HotClass``)
    padded to ``hot.block_m`` downwards from ``num_rows`` in expert order. Returns
    ``(per_expert, starts, ends, is_hot, base_total)``."""
    ids = topk_ids.reshape(-1).tolist()
    per_expert: list[list[int]] = [[] for _ in range(num_experts)]
    for slot, gid in enumerate(ids):
        local = gid - expert_start
        if 0 <= local < num_experts:
            per_expert[local].append(slot)
    starts, ends, is_hot = [], [], []
    base, top = 0, num_rows
    for slots in per_expert:
        c = len(slots)
        hot_e = hot is not None and c >= hot.min_rows and (
            -(-c // hot.block_m) * hot.cost < -(-c // block_m) * hot.base_cost)
        is_hot.append(hot_e)
        if hot_e:
            top -= -(-c // hot.block_m) * hot.block_m
            starts.append(top)
            ends.append(top + -(-c // hot.block_m) * hot.block_m)
        else:
            starts.append(base)
            base += -(-c // block_m) * block_m
            ends.append(base)
    return per_expert, starts, ends, is_hot, base


def _tile_map(num_tiles, tile, segments, per_expert):
    """Expected (tile_expert, tile_rows) of ``tile``-row tiles over the experts' segments."""
    want_tiles, want_rows = [-1] * num_tiles, [0] * num_tiles
    for e, (lo, hi) in segments.items():
        for r in range(lo, hi, tile):
            want_tiles[r // tile] = e
            want_rows[r // tile] = min(tile, len(per_expert[e]) - (r - lo))
    return want_tiles, want_rows


def check_routing(routing, topk_ids, num_experts, expert_start, block_m, routing_mod,
                  hot=None):
    num_slots = topk_ids.numel()
    num_rows = routing_mod.padded_rows(num_slots, num_experts, block_m, hot)
    per_expert, starts, ends, is_hot, base_total = reference_routing(
        topk_ids.cpu(), num_experts, expert_start, block_m, num_rows, hot)
    sorted_slots = routing.sorted_slots.cpu().tolist()
    slot_row = routing.slot_row.cpu().tolist()
    tensors = [routing.sorted_slots, routing.expert_offsets, routing.tile_expert,
               routing.slot_row, routing.tile_rows]
    if hot is not None:
        tensors += [routing.hot_tile_expert, routing.hot_tile_rows]
    for t in tensors:
        assert t.dtype == torch.int32
        # views of one allocation, each 16-byte aligned like a fresh one (the kernels'
        # pointer specialisation must not change) and not overlapping another
        assert t.is_contiguous() and t.data_ptr() % 16 == 0
    spans = sorted((t.data_ptr(), t.data_ptr() + 4 * t.numel()) for t in tensors)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))
    assert len(sorted_slots) == num_rows and num_rows % block_m == 0
    hot_rows = sum(e - s for s, e, h in zip(starts, ends, is_hot, strict=True) if h)
    assert base_total + hot_rows <= num_rows, "static bound P too small"
    assert routing.expert_offsets.cpu().tolist() == starts + [base_total]
    # base tiles cover the one-tile bound, hot tiles the last hot_region_rows rows
    base_bound = routing_mod.padded_rows(num_slots, num_experts, block_m)
    assert base_total <= base_bound
    base_segments = {e: (starts[e], ends[e]) for e in range(num_experts) if not is_hot[e]}
    assert (routing.tile_expert.cpu().tolist(), routing.tile_rows.cpu().tolist()) == _tile_map(
        base_bound // block_m, block_m, base_segments, per_expert)
    if hot is not None:
        region = routing_mod.hot_region_rows(num_slots, num_experts, hot)
        row0 = num_rows - region
        assert routing.hot_block_m == hot.block_m and routing.hot_row0 == row0
        assert row0 % hot.block_m == 0 and row0 >= 0
        hot_segments = {e: (starts[e] - row0, ends[e] - row0) for e in range(num_experts)
                        if is_hot[e]}
        assert all(lo >= 0 for lo, _ in hot_segments.values()), "hot segment below the region"
        assert (routing.hot_tile_expert.cpu().tolist(),
                routing.hot_tile_rows.cpu().tolist()) == _tile_map(
            region // hot.block_m, hot.block_m, hot_segments, per_expert)
    used = [False] * num_rows
    for e, slots in enumerate(per_expert):
        segment = sorted_slots[starts[e]:ends[e]]
        used[starts[e]:ends[e]] = [True] * (ends[e] - starts[e])
        real = segment[:len(slots)]
        # Order inside a segment comes from int32 atomics (scheduling-dependent on a GPU).
        assert sorted(real) == slots, f"expert {e}: slots {sorted(real)} != {slots}"
        assert all(s == num_slots for s in segment[len(slots):]), f"expert {e} padding"
    assert all(s == num_slots for s, u in zip(sorted_slots, used, strict=True) if not u), \
        "rows outside every segment"
    local = {s for slots in per_expert for s in slots}
    assert len(slot_row) == num_slots
    for s in range(num_slots):
        if s in local:
            assert sorted_slots[slot_row[s]] == s
        else:
            assert slot_row[s] == -1


def _ids(num_tokens, top_k, low, high, dtype, generator, distinct=True):
    if distinct and high - low >= top_k:
        rows = [torch.randperm(high - low, generator=generator)[:top_k] + low
                for _ in range(num_tokens)]
        ids = torch.stack(rows) if rows else torch.empty(0, top_k, dtype=torch.long)
    else:
        ids = torch.randint(low, high, (num_tokens, top_k), generator=generator)
    return ids.to(dtype)


CASES = [
    # name, T, k, E, expert_start, id range (low, high), block_m
    ("uniform", 37, 6, 16, 0, (0, 16), 8),
    ("t_equals_1", 1, 6, 16, 0, (0, 16), 8),
    ("t_equals_1_big_tile", 1, 6, 256, 0, (0, 256), 64),
    ("tk_not_multiple", 7, 6, 8, 0, (0, 8), 16),
    ("empty_experts", 5, 2, 64, 0, (10, 14), 8),
    ("ep_mixed", 23, 6, 16, 16, (0, 64), 8),
    ("ep_none_local", 4, 6, 16, 32, (0, 32), 8),
    ("many_slots", 300, 6, 32, 0, (0, 32), 16),
]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_routing_matches_loops(case, dtype, kernels, routing_path):
    _, num_tokens, top_k, num_experts, start, (low, high), block_m = case
    device, routing_mod, _ = kernels
    g = torch.Generator().manual_seed(hash(case[0]) % 2**31)
    ids = _ids(num_tokens, top_k, low, high, dtype, g).to(device)
    routing = routing_mod.moe_routing(ids, num_experts, start, block_m)
    check_routing(routing, ids, num_experts, start, block_m, routing_mod)


def test_routing_skew_all_to_one_expert(kernels, routing_path):
    device, routing_mod, _ = kernels
    num_tokens, top_k, num_experts, block_m = 45, 1, 32, 16
    ids = torch.full((num_tokens, top_k), 7, dtype=torch.int32, device=device)
    routing = routing_mod.moe_routing(ids, num_experts, 0, block_m)
    check_routing(routing, ids, num_experts, 0, block_m, routing_mod)
    offsets = routing.expert_offsets.cpu().tolist()
    assert offsets[7] == 0 and offsets[8] == 48 and offsets[-1] == 48


HOT_CASES = [
    # name, T, k, E, id weights (None: uniform), block_m
    ("one_hot_expert", 200, 2, 16, [40] + [1] * 15, 16),
    ("several_hot", 300, 3, 32, [30, 20, 10, 10] + [1] * 28, 16),
    ("all_cold", 20, 2, 16, None, 32),
    ("hot_at_64", 160, 4, 8, [20, 1, 1, 1, 1, 1, 1, 1], 64),
]


@pytest.mark.parametrize("case", HOT_CASES, ids=[c[0] for c in HOT_CASES])
def test_routing_hot_experts(case, kernels, routing_path):
    """Experts with many rows take the hot tile, laid out downwards from the last row; the
    rest keep the base tile; both tile maps and the slot map match the loops."""
    from nvfp4_ops.kernels import dispatch

    _, num_tokens, top_k, num_experts, weights, block_m = case
    device, routing_mod, _ = kernels
    g = torch.Generator().manual_seed(7)
    if weights is None:
        ids = _ids(num_tokens, top_k, 0, num_experts, torch.int32, g)
    else:
        probs = torch.tensor(weights, dtype=torch.float64).expand(num_tokens, -1)
        ids = torch.multinomial(probs, top_k, replacement=False, generator=g).to(torch.int32)
    ids = ids.to(device)
    hot = dispatch.moe_hot_class(block_m)
    routing = routing_mod.moe_routing(ids, num_experts, 0, block_m, hot=hot)
    check_routing(routing, ids, num_experts, 0, block_m, routing_mod, hot)
    counts = torch.bincount(ids.reshape(-1).long().cpu(), minlength=num_experts)
    hot_experts = set(routing.hot_tile_expert.cpu().tolist()) - {-1}
    if weights is None:
        assert not hot_experts
    else:
        assert hot_experts and all(counts[e] >= hot.min_rows for e in hot_experts)


def test_routing_fused_flag_overrides_the_size_rule(kernels):
    """``fused=False`` runs the four launches at any size (warm-up uses it so that large-T
    calls compile nothing), with the same result as the one-CTA kernel."""
    from nvfp4_ops.kernels import dispatch

    device, routing_mod, _ = kernels
    g = torch.Generator().manual_seed(11)
    ids = _ids(40, 6, 0, 16, torch.int32, g).to(device)
    hot = dispatch.moe_hot_class(16)
    for fused in (True, False):
        routing = routing_mod.moe_routing(ids, 16, 0, 16, hot=hot, fused=fused)
        check_routing(routing, ids, 16, 0, 16, routing_mod, hot)


def test_triton_warmup_covers_both_routing_paths_and_hot_tiles(kernels, monkeypatch):
    """``warmup_triton`` runs the routing as one CTA and as four launches, with and without
    the hot tile wherever a tile has one."""
    device = kernels[0]
    pytest.importorskip("cutlass")
    from nvfp4_ops.kernels import dispatch, moe_cuda

    calls = []
    real = moe_cuda.moe_routing

    def spy(*args, **kw):
        calls.append((args[3], kw.get("hot") and kw["hot"].block_m, kw.get("fused")))
        return real(*args, **kw)

    monkeypatch.setattr(moe_cuda, "moe_routing", spy)
    tiles = dispatch.moe_act_orders(256, 128)
    names = moe_cuda.warmup_triton(256, 2, tiles, device=device, id_dtypes=(torch.int32,))
    for bm, layout in tiles:
        hots = [None] + ([dispatch.moe_hot_class(bm).block_m]
                         if layout == "kperm" and dispatch.moe_hot_class(bm) else [])
        for hot in hots:
            assert (bm, hot, False) in calls and (bm, hot, None) in calls, (bm, hot)
    assert len(names) == sum(1 + (layout == "kperm" and dispatch.moe_hot_class(bm) is not None)
                             for bm, layout in tiles)


@pytest.mark.parametrize("direct", [False, True])
def test_triton_warmup_runs_the_direct_routing_when_on(kernels, monkeypatch, direct):
    """With ``DIRECT_ROUTING`` on, ``warmup_triton`` also runs one token's routing through the
    direct kernel (at each tile it fits), so a decode call compiles nothing later; off, it
    does not run it."""
    device = kernels[0]
    pytest.importorskip("cutlass")
    from nvfp4_ops.kernels import dispatch, moe_cuda
    from nvfp4_ops.kernels.triton import moe_routing

    monkeypatch.setattr(moe_routing, "DIRECT_ROUTING", direct)
    launched = []
    real = moe_routing._direct_routing.launch

    def spy(grid, args, options):
        launched.append(args[14:])  # the constexprs: SLOTS, E_PAD, BLOCK_M, FILL_BLOCK, PDL
        return real(grid, args, options)

    monkeypatch.setattr(moe_routing._direct_routing, "launch", spy)
    tiles = dispatch.moe_act_orders(256, 128)
    moe_cuda.warmup_triton(256, 6, tiles, device=device, id_dtypes=(torch.int32,))
    fits = {bm for bm, _ in tiles if moe_routing.direct_routing_fits(6, bm, None)}
    assert fits, tiles
    pdl = (False, True) if device == "cuda" else (False,)  # launch overlap needs CUDA
    assert {(a[2], a[4]) for a in launched} == ({(bm, p) for bm in fits for p in pdl}
                                                if direct else set())


def test_routing_repeated_ids_in_one_row(kernels, routing_path):
    """Routers never repeat an expert within a row, but the kernels must not care."""
    device, routing_mod, _ = kernels
    g = torch.Generator().manual_seed(3)
    ids = _ids(29, 6, 0, 4, torch.int64, g, distinct=False).to(device)
    routing = routing_mod.moe_routing(ids, 4, 0, 8)
    check_routing(routing, ids, 4, 0, 8, routing_mod)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_direct_routing_small_calls(kernels, monkeypatch, dtype):
    """The direct kernel (``DIRECT_ROUTING``) at every slot count it takes, with repeated ids,
    ids of other EP ranks and a hot class no expert can reach: the loops' layout, and the
    one-CTA kernel's up to the order inside a segment (bitwise where every expert holds one
    slot). Calls whose slots do not fit it take the one-CTA kernel."""
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.testing import routing_mismatch

    device, routing_mod, _ = kernels
    g = torch.Generator().manual_seed(5)
    cases = [(n_tokens, top_k, block_m, start, hot_bm)
             for n_tokens, top_k in ((1, 1), (1, 6), (1, 8), (2, 4), (2, 3))
             for block_m in (8, 16)
             for start in (0, 5)
             for hot_bm in (None, 64)]
    for num_tokens, top_k, block_m, start, hot_bm in cases:
        hot = dispatch.moe_hot_class(block_m) if hot_bm else None
        num_slots = num_tokens * top_k
        assert routing_mod.direct_routing_fits(num_slots, block_m, hot)
        # ids over [0, 24): 16 local experts from `start`, repeats within and across tokens
        ids = torch.randint(0, 24, (num_tokens, top_k), generator=g).to(dtype).to(device)
        monkeypatch.setattr(routing_mod, "DIRECT_ROUTING", True)
        _, launch = routing_mod.routing_launch(ids, 16, start, block_m, hot=hot)
        assert launch.launcher is routing_mod._direct_routing
        direct = routing_mod.moe_routing(ids, 16, start, block_m, hot=hot)
        check_routing(direct, ids, 16, start, block_m, routing_mod, hot)
        monkeypatch.setattr(routing_mod, "DIRECT_ROUTING", False)
        fused = routing_mod.moe_routing(ids, 16, start, block_m, hot=hot)
        assert routing_mismatch(direct, fused, ids, start) is None
        if hot is not None:
            assert torch.equal(direct.hot_tile_expert, fused.hot_tile_expert)
            assert torch.equal(direct.hot_tile_rows, fused.hot_tile_rows)
        local = ids.reshape(-1).long() - start
        local = local[(local >= 0) & (local < 16)]
        if local.unique().numel() == local.numel():
            for a, b in zip(direct, fused, strict=True):
                assert a == b if not isinstance(a, torch.Tensor) else torch.equal(a, b)
    monkeypatch.setattr(routing_mod, "DIRECT_ROUTING", True)
    ids = torch.zeros(3, 6, dtype=dtype, device=device)  # 18 slots: more than a tile of 8
    for num_slots, block_m, hot in ((18, 8, None), (0, 8, None), (9, 8, None), (17, 32, None),
                                    (12, 16, dispatch.moe_hot_class(16))):
        fits = routing_mod.direct_routing_fits(num_slots, block_m, hot)
        assert fits == (num_slots == 12 and hot.min_rows > 12), (num_slots, block_m)
    _, launch = routing_mod.routing_launch(ids, 16, 0, 8)
    assert launch.launcher is routing_mod._fused_routing


def test_routing_zero_tokens(kernels, routing_path):
    device, routing_mod, _ = kernels
    ids = torch.empty(0, 6, dtype=torch.int32, device=device)
    routing = routing_mod.moe_routing(ids, 16, 0, 8)
    assert routing.sorted_slots.numel() == 0 and routing.slot_row.numel() == 0
    assert routing.expert_offsets.cpu().tolist() == [0] * 17



def test_routing_mismatch_names_what_differs(kernels):
    """``testing.routing_mismatch`` (what ``benchmarks/dev/routing_warps.py`` checks each warp
    count with): the one-CTA and the four-launch routing agree; each broken field is named."""
    from nvfp4_ops.testing import routing_mismatch, uniform_routing

    device, routing_mod, _ = kernels
    ids, _ = uniform_routing(16, 64, 6, seed=3)
    ids = ids.to(device)
    fused = routing_mod.moe_routing(ids, 16, 8, 8, fused=True)
    multi = routing_mod.moe_routing(ids, 16, 8, 8, fused=False)
    assert routing_mismatch(fused, multi, ids, 8) is None

    rows = fused.tile_rows.clone()
    rows[0] += 1
    assert routing_mismatch(fused._replace(tile_rows=rows), multi, ids, 8) == "tile_rows"
    slot_row = fused.slot_row.clone()
    first_local = int((slot_row >= 0).nonzero()[0])
    slot_row[first_local] = -1
    assert "which slots are local" in routing_mismatch(fused._replace(slot_row=slot_row),
                                                       multi, ids, 8)
    # two local slots of different experts trade rows: still inverse maps, wrong segments
    local = (ids.reshape(-1).long() - 8).cpu()
    slots = [s for s in range(ids.numel()) if 0 <= int(local[s]) < 16]
    s1 = slots[0]
    s2 = next(s for s in slots if int(local[s]) != int(local[s1]))
    slot_row, sorted_slots = fused.slot_row.clone(), fused.sorted_slots.clone()
    r1, r2 = int(slot_row[s1]), int(slot_row[s2])
    slot_row[s1], slot_row[s2] = r2, r1
    sorted_slots[r1], sorted_slots[r2] = s2, s1
    swapped = fused._replace(slot_row=slot_row, sorted_slots=sorted_slots)
    assert routing_mismatch(swapped, multi, ids, 8) == "a slot outside its expert's segment"
    sorted_slots = fused.sorted_slots.clone()
    sorted_slots[r1] = s2
    assert "inverse" in routing_mismatch(fused._replace(sorted_slots=sorted_slots), multi, ids, 8)

def test_padded_rows_bound():
    from nvfp4_ops.kernels.triton.moe_routing import padded_rows

    assert padded_rows(6, 256, 8) == 48
    assert padded_rows(6 * 4096, 256, 128) == 24576 + 256 * 127
    assert padded_rows(0, 256, 8) == 0
    # worst case: every slot a different expert, each padded to a full tile
    assert padded_rows(5, 5, 16) == 80


def test_kperm_layout():
    from nvfp4_ops.orders.kperm import KPERM_BLOCK, dst, permute_k, src

    assert sorted(src(p) for p in range(KPERM_BLOCK)) == list(range(KPERM_BLOCK))
    assert all(dst(src(p)) == p for p in range(KPERM_BLOCK))
    # the WGMMA fragment pairing (orders/kperm.py): logical 16 s + 8 h + 2 c + e
    # holds physical 8 c + (2 s + h) + 4 e
    for p in range(KPERM_BLOCK):
        s, h, c, e = p // 16, (p // 8) % 2, (p // 2) % 4, p % 2
        assert src(p) == 8 * c + 2 * s + h + 4 * e
    x = torch.arange(2 * 64).reshape(2, 64)
    y = permute_k(x)
    assert y[1, 32 + 1] == x[1, 32 + src(1)] and y[0, 9] == x[0, src(9)]
    with pytest.raises(ValueError, match="multiple of 32"):
        permute_k(torch.zeros(3, 48))


def test_pair_layout():
    """The streamed family's 8-block pair order (orders/kperm.py)."""
    from nvfp4_ops.orders import kperm as kp

    assert kp.PAIR_BLOCK == 8
    assert [kp.pair_src(p) for p in range(8)] == [0, 4, 1, 5, 2, 6, 3, 7]
    assert all(kp.pair_dst(kp.pair_src(p)) == p for p in range(8))
    # the streamed kernel's B fragment: the 16-byte load of one 8-block is 4 u32 words, word j
    # = stored positions (2j, 2j+1) (low, high bf16); the pair4 decoder's word j pairs codes
    # (j, j+4): the word must hold exactly physical k (j, j+4)
    for j in range(4):
        assert (kp.pair_src(2 * j), kp.pair_src(2 * j + 1)) == (j, j + 4)
    x = torch.arange(3 * 48).reshape(3, 48)
    y = kp.permute_pairs(x)
    assert torch.equal(y, kp.to_layout(x, "pair"))
    for b in range(6):
        for p in range(8):
            assert y[2, 8 * b + p] == x[2, 8 * b + kp.pair_src(p)]
    for layout in kp.LAYOUTS:
        z = kp.to_layout(torch.arange(64), layout)
        assert torch.equal(kp.from_layout(z, layout), torch.arange(64))
        assert [int(z[kp.stored_column(f, layout)]) for f in range(64)] == list(range(64))
    assert kp.stored_column(13, "pair") == 8 + kp.pair_dst(5) == 11
    pytest.importorskip("cutlass")
    from nvfp4_ops.kernels import dispatch

    # what the MoE gathers into: the order of the tile's family (V4-Flash sizes), at every
    # tile of the policy
    assert dispatch.moe_act_orders(4096, 2048) == [(8, "pair")] + [
        (bm, "kperm") for bm in (16, 64, 128, 256)]
    with pytest.raises(ValueError, match="multiple of 8"):
        kp.permute_pairs(torch.zeros(2, 12))
    with pytest.raises(ValueError, match="layout must be one of"):
        kp.to_layout(torch.zeros(2, 16), "pairs")


# (block_m, H, layout the gather writes); H = 104 is a multiple of 8 but not of 32 or BLOCK_H
GATHER_CASES = [
    (8, 96, "natural"),
    (8, 96, "pair"),
    (16, 96, "kperm"),
    (8, 104, "pair"),
    (16, 96, "pair"),
    (8, 96, "kperm"),
    (16, 104, "natural"),
]


@pytest.mark.parametrize("block_m,hidden_size,layout", GATHER_CASES)
def test_gather_rows(kernels, block_m, hidden_size, layout):
    device, routing_mod, _ = kernels
    g = torch.Generator().manual_seed(11)
    num_tokens, top_k, num_experts = 13, 3, 8
    ids = _ids(num_tokens, top_k, 0, 12, torch.int32, g).to(device)  # some non-local
    hidden = torch.randn(num_tokens, hidden_size, generator=g).to(torch.bfloat16).to(device)
    weights = torch.rand(num_tokens, top_k, generator=g).to(device)
    routing = routing_mod.moe_routing(ids, num_experts, 0, block_m)
    a, row_scale = routing_mod.gather_rows(hidden, weights, routing, layout)
    assert a.shape == (routing.sorted_slots.numel(), hidden_size) and a.dtype == torch.bfloat16
    if layout != "natural":
        # an independent statement of each order (orders/kperm.py): stored position q of a
        # block holds k 4 (q % 8) + q // 8 (kperm, 32-blocks) or q // 2 + 4 (q % 2) (pair)
        block = 32 if layout == "kperm" else 8
        within = [4 * (q % 8) + q // 8 if layout == "kperm" else q // 2 + 4 * (q % 2)
                  for q in range(block)]
        idx = torch.tensor([b + q for b in range(0, hidden_size, block) for q in within])
        hidden = hidden[:, idx.to(hidden.device)]
    end = int(routing.expert_offsets[-1])
    slots = routing.sorted_slots.cpu()
    a, row_scale, hidden, weights = a.cpu(), row_scale.cpu(), hidden.cpu(), weights.cpu()
    for r in range(end):
        s = int(slots[r])
        if s == num_tokens * top_k:
            assert torch.equal(a[r], torch.zeros(hidden_size, dtype=torch.bfloat16))
            assert row_scale[r] == 0
        else:
            assert torch.equal(a[r], hidden[s // top_k])
            assert row_scale[r] == weights.reshape(-1)[s]


def test_gather_rows_layout_errors(kernels):
    device, routing_mod, _ = kernels
    ids = torch.zeros(2, 2, dtype=torch.int32, device=device)
    routing = routing_mod.moe_routing(ids, 4, 0, 8)
    weights = torch.ones(2, 2, device=device)
    with pytest.raises(ValueError, match="H % 32"):
        routing_mod.gather_rows(torch.zeros(2, 104, dtype=torch.bfloat16, device=device),
                                weights, routing, "kperm")
    with pytest.raises(ValueError, match="H % 8"):
        routing_mod.gather_rows(torch.zeros(2, 36, dtype=torch.bfloat16, device=device),
                                weights, routing, "pair")
    with pytest.raises(ValueError, match="layout must be one of"):
        routing_mod.gather_rows(torch.zeros(2, 96, dtype=torch.bfloat16, device=device),
                                weights, routing, "k32")


@pytest.mark.parametrize("num_tokens", [0, 1, 9])
def test_combine_fixed_order_and_non_local(kernels, num_tokens):
    device, _, combine_mod = kernels
    g = torch.Generator().manual_seed(5 + num_tokens)
    top_k, hidden_size, num_rows = 4, 80, 64
    y = torch.randn(num_rows, hidden_size, generator=g).to(torch.bfloat16)
    slot_row = torch.randperm(num_rows, generator=g)[:num_tokens * top_k].to(torch.int32)
    if num_tokens:
        slot_row[1::3] = -1  # non-local slots
        slot_row[:top_k] = -1  # token 0: no local expert at all -> exactly 0
    out = combine_mod.combine(y.to(device), slot_row.to(device), num_tokens, top_k, 1.5)
    assert out.shape == (num_tokens, hidden_size) and out.dtype == torch.bfloat16
    want = torch.zeros(num_tokens, hidden_size)
    for t in range(num_tokens):
        for j in range(top_k):
            r = int(slot_row[t * top_k + j])
            if r >= 0:
                want[t] += y[r].float()
    want = want * 1.5
    if device == "cpu":
        # Triton's interpreter converts fp32 -> bf16 by truncation (numpy has no bf16); the
        # GPU rounds to nearest even.
        want = (want.view(torch.int32) & -65536).view(torch.float32)
    assert torch.equal(out.cpu(), want.to(torch.bfloat16))
    if num_tokens:
        assert torch.equal(out[0].cpu(), torch.zeros(hidden_size, dtype=torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# The orchestration (routing -> gather -> 2 grouped GEMMs -> combine) with a pure-torch stand-in
# for the CuTeDSL grouped GEMM, so the data flow is checked on CPU against the reference. The
# stand-in lives in this test only; the registered CUDA path uses the real kernel.
# ---------------------------------------------------------------------------------------------


def torch_grouped_gemm(a, tile_expert, w, w_scale, w_global, out, *, epilogue, swiglu_limit,
                       row_scale, bias, block_m, kperm=False, tile_rows=None):
    """The grouped-GEMM contract in torch: only tiles with an expert are computed/written
    (``kperm``: ``a`` is in the permuted order of the tile's family, the 8-block ``pair`` order
    of the streamed kernel at block_m 8, the 32-block ``kperm`` order of WGMMA at 16-256, and
    a SwiGLU output is written in it). ``w_global`` is the kernels' ``[G, H2, N / H2]`` (any
    strides; ``H2 = 2`` for ``swiglu``), read here as per-row globals ``[N]`` of each expert
    (gate half, then up half). With ``tile_rows`` the contract lets padding rows hold anything:
    they are written NaN here, so a caller that read them would fail."""
    from nvfp4_ops.orders.kperm import stored_column
    from nvfp4_ops.reference.linear import linear_fp32
    from nvfp4_ops.reference.mlp import clamped_swiglu

    if tile_rows is not None:
        torch_grouped_gemm(a, tile_expert, w, w_scale, w_global, out, epilogue=epilogue,
                           swiglu_limit=swiglu_limit, row_scale=row_scale, bias=bias,
                           block_m=block_m, kperm=kperm)
        row_in_tile = torch.arange(out.shape[0], device=out.device) % block_m
        real = tile_rows.repeat_interleave(block_m)[: out.shape[0]]
        used = (tile_expert >= 0).repeat_interleave(block_m)[: out.shape[0]]
        out[used & (row_in_tile >= real)] = float("nan")
        return

    if kperm:  # back to the natural k order, then the plain contract, then permute the output
        layout = "pair" if block_m == 8 else "kperm"  # the families' orders, stated here
        cols = torch.tensor([stored_column(k, layout) for k in range(a.shape[1])])
        nat = torch.empty_like(out)
        torch_grouped_gemm(a[:, cols.to(a.device)], tile_expert, w, w_scale, w_global, nat,
                           epilogue=epilogue, swiglu_limit=swiglu_limit, row_scale=row_scale,
                           bias=bias, block_m=block_m)
        valid = (tile_expert >= 0).repeat_interleave(block_m)
        if epilogue == "swiglu":
            out_cols = torch.tensor([stored_column(f, layout) for f in range(out.shape[1])])
            permuted = torch.empty_like(nat[valid])
            permuted[:, out_cols.to(out.device)] = nat[valid]
            out[valid] = permuted
        else:
            out[valid] = nat[valid]
        return

    num_rows = a.shape[0]
    n = w.shape[1]
    assert bias is None and num_rows % block_m == 0
    assert tile_expert.dtype == torch.int32 and tile_expert.shape == (num_rows // block_m,)
    halves = 2 if epilogue == "swiglu" else 1
    assert w_global.shape == (w.shape[0], halves, n // halves)
    assert w_global.dtype == torch.float32
    for tile, e in enumerate(tile_expert.tolist()):
        if e < 0:
            continue
        rows = slice(tile * block_m, (tile + 1) * block_m)
        acc = linear_fp32(a[rows], w[e], w_scale[e], w_global[e].reshape(n))
        if epilogue == "swiglu":
            val = clamped_swiglu(acc[:, :n // 2], acc[:, n // 2:], swiglu_limit)
        else:
            assert epilogue == "row_scale"
            val = acc * row_scale[rows, None]
        out[rows] = val.to(torch.bfloat16)


def torch_gemm(plan, a, w, w_scale, w_global, out, *, tile_expert, tile_rows=None,
               row_scale=None, swiglu_limit=None, bias=None, check=True):
    """:func:`torch_grouped_gemm` with the launcher's signature (``moe_forward``'s ``gemm``)."""
    torch_grouped_gemm(a, tile_expert, w, w_scale, w_global, out,
                       epilogue=plan.config.epilogue, swiglu_limit=swiglu_limit,
                       row_scale=row_scale, bias=bias, block_m=plan.block_m,
                       kperm=plan.act_order != "natural", tile_rows=tile_rows)


def stand_in_plan(num_tokens, top_k, num_experts, block_m, kperm, hot=False):
    """A MoE plan for the torch stand-in GEMM: the routing's tile and padded rows as the op
    computes them, the activation order stated independently (pair at 8, kperm at 16+);
    its GEMM "configs" carry only what the stand-in reads. ``hot``: with the base tile's hot
    class (``dispatch.moe_hot_class``)."""
    from types import SimpleNamespace

    from nvfp4_ops.kernels.dispatch import (
        GemmPlan,
        HotPlan,
        MoEPlan,
        WeightOrder,
        moe_block_m,
        moe_hot_class,
    )
    from nvfp4_ops.kernels.triton.moe_routing import padded_rows

    bm = block_m or moe_block_m(num_tokens * top_k, num_experts)
    layout = ("pair" if bm == 8 else "kperm") if kperm else "natural"
    order = WeightOrder.CHECKPOINT

    def gemm(epilogue, tile=bm):
        return GemmPlan("torch", SimpleNamespace(epilogue=epilogue, block_m=tile, order=order,
                                                 act_order=layout))

    hot_class = moe_hot_class(bm) if hot else None
    hot_plan = None if hot_class is None else HotPlan(
        hot_class, gemm("swiglu", hot_class.block_m), gemm("row_scale", hot_class.block_m))
    return MoEPlan(padded_rows(num_tokens * top_k, num_experts, bm, hot_class),
                   gemm("swiglu"), gemm("row_scale"), hot_plan, chained=False)


@pytest.fixture(scope="module")
def tiny_experts():
    from nvfp4_ops.testing import random_experts

    torch.manual_seed(0)
    return random_experts(16, 256, 128, up_scale_ratio=3.0)


@pytest.mark.parametrize("num_tokens,expert_start,id_range,block_m", [
    (1, 0, None, None),
    (7, 0, None, 8),
    (33, 0, None, 16),
    (20, 16, (0, 48), None),  # EP: a third of the ids are local
    (12, 0, "skew", 32),
])
@pytest.mark.parametrize("kperm", [False, True])
def test_orchestration_vs_reference(kernels, tiny_experts, num_tokens, expert_start, id_range,
                                    block_m, kperm):
    device, _, _ = kernels
    from nvfp4_ops.kernels.moe_cuda import moe_forward
    from nvfp4_ops.reference import moe_reference
    from nvfp4_ops.testing import random_routing, rel_l2

    torch.manual_seed(100 + num_tokens)
    experts = tiny_experts
    num_experts, top_k = experts.num_experts, 6
    hidden = torch.randn(num_tokens, 256).to(torch.bfloat16)
    ids, weights = random_routing(num_tokens, num_experts, top_k, expert_start=expert_start)
    if id_range == "skew":
        ids[:, 0] = 3  # every token's first choice is expert 3; the rest uniform
        ids[:, 1:] = torch.where(ids[:, 1:] == 3, 4, ids[:, 1:])
    elif id_range is not None:
        ids = torch.randint(*id_range, ids.shape, dtype=torch.int32)
        ids[0] = torch.arange(top_k) + 40  # token 0: no local expert at all
    args = (hidden, ids, weights, *experts.args(), expert_start, 10.0, 1.5)
    want = moe_reference(*args)
    plan = stand_in_plan(num_tokens, top_k, num_experts, block_m, kperm)
    got = moe_forward(*(t.to(device) if isinstance(t, torch.Tensor) else t for t in args),
                      plan=plan, gemm=torch_gemm).cpu()
    assert got.shape == want.shape and got.dtype == torch.bfloat16
    assert not got.isnan().any()
    err = rel_l2(got, want)
    # bf16 rounding of each slot's output and of the sum; the interpreter rounds by truncation
    # (about twice the error of round-to-nearest). A wrong row, scale or weight is O(1).
    bound = 8e-3 if device == "cpu" else 3e-3
    assert err < bound, f"relative L2 error {err:.2e}"
    if id_range not in (None, "skew"):
        assert torch.equal(got[0], torch.zeros_like(got[0]))


@pytest.mark.parametrize("block_m", [16, 32])
def test_orchestration_hot_experts(kernels, tiny_experts, block_m):
    """Two token tiles in one call: a hot expert (every token's first choice) in the hot
    tile, the others in the base tile; each GEMM runs once per tile over the same buffers,
    and the result is the reference's. The plan must really have put an expert in a hot
    tile (checked on the routing), or the test would not test the second tile."""
    device, routing_mod, _ = kernels
    from nvfp4_ops.kernels.moe_cuda import moe_forward
    from nvfp4_ops.reference import moe_reference
    from nvfp4_ops.testing import random_routing, rel_l2

    torch.manual_seed(9)
    num_tokens, top_k, num_experts = 90, 6, tiny_experts.num_experts
    hidden = torch.randn(num_tokens, 256).to(torch.bfloat16)
    ids, weights = random_routing(num_tokens, num_experts, top_k)
    ids[:, 0] = 3
    ids[:, 1:] = torch.where(ids[:, 1:] == 3, 4, ids[:, 1:])
    args = (hidden, ids, weights, *tiny_experts.args(), 0, 10.0, 1.5)
    want = moe_reference(*args)
    plan = stand_in_plan(num_tokens, top_k, num_experts, block_m, True, hot=True)
    assert plan.hot is not None
    dev_args = [t.to(device) if isinstance(t, torch.Tensor) else t for t in args]
    routing = routing_mod.moe_routing(dev_args[1], num_experts, 0, block_m,
                                      hot=plan.hot.routing)
    assert 3 in routing.hot_tile_expert.cpu().tolist()
    assert 3 not in routing.tile_expert.cpu().tolist()
    got = moe_forward(*dev_args, plan=plan, gemm=torch_gemm).cpu()
    err = rel_l2(got, want)
    assert err < (8e-3 if device == "cpu" else 3e-3), f"relative L2 error {err:.2e}"


def test_orchestration_wrong_order_fails(kernels, tiny_experts, monkeypatch):
    """Negative control for the test above: a stand-in GEMM that reads (and writes) the
    32-block ``kperm`` order at block_m 8, while the gather writes the pair order there, gives
    a wrong result: the orchestration test tells the two orders apart."""
    device, _, _ = kernels
    from nvfp4_ops.kernels.moe_cuda import moe_forward
    from nvfp4_ops.orders import kperm as kp
    from nvfp4_ops.reference import moe_reference
    from nvfp4_ops.testing import random_routing, rel_l2

    torch.manual_seed(5)
    hidden = torch.randn(7, 256).to(torch.bfloat16)
    ids, weights = random_routing(7, tiny_experts.num_experts, 6)
    args = (hidden, ids, weights, *tiny_experts.args(), 0, 10.0, 1.5)
    want = moe_reference(*args)
    kperm_column = kp.stored_column
    monkeypatch.setattr(kp, "stored_column", lambda f, layout: kperm_column(f, "kperm"))
    got = moe_forward(*(t.to(device) if isinstance(t, torch.Tensor) else t for t in args),
                      plan=stand_in_plan(7, 6, tiny_experts.num_experts, 8, True),
                      gemm=torch_gemm).cpu()
    assert rel_l2(got.float(), want) > 0.1
