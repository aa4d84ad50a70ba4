"""``nvfp4::moe`` on the GPU (the CUDA path of ``nvfp4_ops.kernels.moe_cuda``) against the
reference: V4-Flash and tiny shapes, skew, empty experts, EP, CUDA graphs with new routing,
torch.compile with a dynamic T, opcheck, bad inputs.

Every test runs the real CUDA path: the module fixture checks that the op dispatches to
``moe_cuda``, so no test can silently pass on the GPU reference fallback.
"""

from __future__ import annotations

import pytest
import torch

import nvfp4_ops
from nvfp4_ops.reference import moe_reference
from nvfp4_ops.testing import (
    assert_moe_close,
    capture_graph,
    make_routing,
    random_experts,
    random_routing,
)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_moe_kernel")]

FLASH = nvfp4_ops.get_shape("v4-flash")
TINY = nvfp4_ops.get_shape("tiny")
TOKENS = (1, 2, 7, 64, 199, 1024, 4096)


def _experts(shape, seed):
    torch.manual_seed(seed)
    return random_experts(shape.experts, shape.hidden, shape.intermediate, device="cuda",
                          up_scale_ratio=2.5)


@pytest.fixture(scope="module")
def flash():
    return _experts(FLASH, 0)


@pytest.fixture(scope="module")
def tiny():
    return _experts(TINY, 1)


def _poison_allocator(nbytes: int) -> None:
    """Fill the caching allocator's free blocks with NaN so that buffers the op allocates
    next start as NaN: a row the kernels forget to write shows up as NaN in the output."""
    junk = torch.full((nbytes // 4,), float("nan"), device="cuda")
    del junk


def _hidden(num_tokens, hidden_size):
    return torch.randn(num_tokens, hidden_size, device="cuda").to(torch.bfloat16)


def _forward(shape, experts, hidden, ids, weights, plan, expert_start=0):
    """``moe_cuda.moe_forward`` on ``plan`` (output scale 1.5) into a NaN-poisoned allocator:
    the tests that run one plan against a variant of it."""
    from nvfp4_ops.kernels import moe_cuda

    _poison_allocator(8 * plan.num_rows * (shape.hidden + shape.intermediate))
    return moe_cuda.moe_forward(hidden, ids, weights, *experts.args(), expert_start,
                                shape.swiglu_limit, 1.5, plan=plan)


def _check_plan_and_variant(shape, experts, hidden, ids, weights, plan, variant, label,
                            expert_start=0):
    """``plan``'s output equals the reference's, and bitwise that of ``variant`` (the same
    plan with other config fields: a kernel form that must not change a bit)."""
    got = _forward(shape, experts, hidden, ids, weights, plan, expert_start)
    want = moe_reference(hidden, ids, weights, *experts.args(), expert_start,
                         shape.swiglu_limit, 1.5)
    assert_moe_close(got, want, label)
    assert torch.equal(got, _forward(shape, experts, hidden, ids, weights, variant,
                                     expert_start)), f"{label}: differs from its variant"


def _run(shape, experts, hidden, ids, weights, expert_start=0, output_scale=1.5):
    args = (hidden, ids, weights, *experts.args())
    kw = dict(expert_start=expert_start, swiglu_limit=shape.swiglu_limit,
              output_scale=output_scale)
    _poison_allocator(8 * (hidden.shape[0] * shape.top_k + 64 * shape.experts)
                      * (shape.hidden + shape.intermediate) + 2**20)
    got = nvfp4_ops.moe(*args, **kw)
    want = moe_reference(*args, expert_start, shape.swiglu_limit, output_scale)
    return got, want


@pytest.mark.parametrize("num_tokens", TOKENS)
def test_flash_matches_reference(flash, num_tokens):
    torch.manual_seed(10 + num_tokens)
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids, weights = random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda")
    got, want = _run(FLASH, flash, hidden, ids, weights)
    assert_moe_close(got, want, f"v4-flash T={num_tokens}")


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_tiny_matches_reference(tiny, num_tokens, id_dtype):
    torch.manual_seed(20 + num_tokens)
    hidden = _hidden(num_tokens, TINY.hidden)
    ids, weights = random_routing(num_tokens, TINY.experts, TINY.top_k, device="cuda",
                                  dtype=id_dtype)
    got, want = _run(TINY, tiny, hidden, ids, weights)
    assert_moe_close(got, want, f"tiny T={num_tokens} {id_dtype}")


def test_skew_all_slots_to_one_expert(flash):
    torch.manual_seed(30)
    num_tokens = 199
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids = torch.full((num_tokens, FLASH.top_k), 77, dtype=torch.int32, device="cuda")
    weights = torch.rand(num_tokens, FLASH.top_k, device="cuda")
    got, want = _run(FLASH, flash, hidden, ids, weights)
    assert_moe_close(got, want, "all 1194 slots to expert 77")


def test_skew_first_choice_shared_and_empty_experts(flash):
    torch.manual_seed(31)
    num_tokens = 1024
    hidden = _hidden(num_tokens, FLASH.hidden)
    # every token: expert 5 first, the rest among 7 experts -> 248 experts get no token
    ids = torch.stack([torch.randperm(7, device="cuda")[:5] + 10 for _ in range(num_tokens)])
    ids = torch.cat([torch.full((num_tokens, 1), 5, device="cuda"), ids], 1).to(torch.int32)
    weights = torch.rand(num_tokens, FLASH.top_k, device="cuda")
    got, want = _run(FLASH, flash, hidden, ids, weights)
    assert_moe_close(got, want, "skewed + empty experts")


def _hot_tiles_used(num_tokens, ids, num_experts, expert_start=0, global_num_experts=-1):
    """The plan of the op's call and whether its routing put any expert in a hot tile."""
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.kernels.triton.moe_routing import moe_routing

    plan = dispatch.plan_moe(num_tokens, FLASH.top_k, num_experts, FLASH.hidden,
                             FLASH.intermediate, global_num_experts=global_num_experts)
    if plan.hot is None:
        return plan, False
    routing = moe_routing(ids, num_experts, expert_start, plan.block_m, hot=plan.hot.routing)
    return plan, bool((routing.hot_tile_expert >= 0).any())


@pytest.mark.parametrize("case", ["zipf", "six_experts_take_all", "ep2_zipf"])
@pytest.mark.parametrize("num_tokens", [512, 1024, 2048])
def test_hot_expert_tiles_match_reference(flash, case, num_tokens):
    """Skewed routing at sizes whose plan has a hot tile (``dispatch.moe_hot_class``): hot
    experts in the large tile, the rest in the base tile, one output. ``six_experts_take_all``
    is the worst skew (every token picks experts 0-5: six segments of T rows, all hot);
    ``ep2_zipf`` one rank of two (128 local experts of 256)."""

    start, local = (128, 128) if case == "ep2_zipf" else (0, FLASH.experts)
    rank = type(flash)(*(t[start:start + local] for t in flash.args()))
    hidden = _hidden(num_tokens, FLASH.hidden)
    if case == "six_experts_take_all":
        ids = torch.arange(FLASH.top_k, dtype=torch.int32).expand(num_tokens, -1).contiguous()
        weights = torch.rand(num_tokens, FLASH.top_k)
    else:
        ids, weights = make_routing("skew", num_tokens, FLASH.experts, FLASH.top_k,
                                    seed=num_tokens)
    ids, weights = ids.cuda(), weights.cuda()
    global_e = FLASH.experts if case == "ep2_zipf" else -1
    plan, used = _hot_tiles_used(num_tokens, ids, local, start, global_e)
    assert plan.hot is not None and used, "the case must exercise the hot tile"
    args = (hidden, ids, weights, *rank.args())
    _poison_allocator(8 * plan.num_rows * (FLASH.hidden + FLASH.intermediate))
    got = nvfp4_ops.moe(*args, expert_start=start, global_num_experts=global_e,
                        swiglu_limit=FLASH.swiglu_limit, output_scale=1.5)
    want = moe_reference(*args, start, FLASH.swiglu_limit, 1.5)
    assert_moe_close(got, want, f"{case} T={num_tokens} bm={plan.block_m}/"
                                f"{plan.hot.routing.block_m}")


def _routing_with_counts(counts, num_tokens, num_experts, top_k):
    """Ids ``[num_tokens, top_k]`` in which expert ``e < len(counts)`` gets exactly
    ``counts[e]`` slots and the other slots go to the remaining experts, at most ``num_tokens``
    each; slot ``j`` (sorted by expert) is token ``j % num_tokens``'s, so no token picks an
    expert twice."""
    counts = list(counts)
    rest = num_tokens * top_k - sum(counts)
    assert rest >= 0 and max(counts) <= num_tokens
    for _ in range(len(counts), num_experts):
        counts.append(min(rest, num_tokens // 4))
        rest -= counts[-1]
    assert rest == 0, "too few experts for the slots"
    flat = torch.repeat_interleave(torch.arange(num_experts), torch.tensor(counts))
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32)
    for j, e in enumerate(flat.tolist()):
        ids[j % num_tokens, j // num_tokens] = e
    return ids


@pytest.mark.parametrize("block_m,hot", [(64, False), (128, False), (256, False), (64, True)])
def test_flexible_width_tiles_every_width(flash, block_m, hot):
    """Flexible-width tiles (``WgmmaConfig.flex``): experts whose rows end in every width
    class of the tile (1 row, a class boundary, one past it, a full tile, a full tile and one
    row; classes of 16 for the 64-row tile, ``dispatch.MOE_FLEX``) give the reference's output
    and bitwise the output of the same plan at whole width; with ``hot``, the hot experts'
    256-row tile is flexible too."""
    from nvfp4_ops.kernels import dispatch

    num_tokens = 512
    counts = [1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 96, 97, 127, 128, 129, 192, 193,
              255, 256, 257, 300]
    ids = _routing_with_counts(counts, num_tokens, FLASH.experts, FLASH.top_k).cuda()
    weights = torch.rand(num_tokens, FLASH.top_k, device="cuda")
    hidden = _hidden(num_tokens, FLASH.hidden)
    sizes = (num_tokens, FLASH.top_k, FLASH.experts, FLASH.hidden, FLASH.intermediate)

    def run(flex):
        plan = dispatch.plan_moe(*sizes, block_m=block_m, hot=hot, flex=flex)
        assert plan.block_m == block_m and (plan.hot is not None) == hot
        gemms = [plan.gate_up, plan.down] + ([plan.hot.gate_up, plan.hot.down] if hot else [])
        assert all(bool(g.config.flex) == flex for g in gemms)
        return _forward(FLASH, flash, hidden, ids, weights, plan)

    got = run(True)
    want = moe_reference(hidden, ids, weights, *flash.args(), 0, FLASH.swiglu_limit, 1.5)
    assert_moe_close(got, want, f"flex bm={block_m} hot={hot}")
    assert torch.equal(got, run(False)), "flexible width differs from whole width"


@pytest.mark.parametrize("shape_name,ep,block_m", [("v4-flash", 1, 128), ("v4-pro", 1, 128),
                                                    ("v4-pro", 8, 128), ("v4-flash", 1, 64),
                                                    ("v4-pro", 1, 64), ("v4-pro", 8, 64)])
def test_four_row_warpgroup_tiles_equal_two(shape_name, ep, block_m):
    """The grouped tiles the dispatch runs with four row warpgroups
    (``dispatch.GROUPED_ROW_WGS``: 128 rows; 64 rows from K = 3072) give the reference's
    output and bitwise the output of the same plan with two (each output element sums the
    same products in the same order), for experts ending in every width class; V4-Pro as one
    EP 8 rank too (48 local experts of 384, global ids, two thirds of the slots on other
    ranks' experts)."""
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.testing import ep_slice, fast_random_experts, with_config_fields

    shape = nvfp4_ops.get_shape(shape_name)
    start, local = ep_slice(shape.experts, ep)
    experts = fast_random_experts(local, shape.hidden, shape.intermediate, device="cuda",
                                  first_expert=start, seed=7)
    num_tokens = 512
    counts = [1, 31, 32, 33, 64, 65, 96, 97, 127, 128, 129, 200]
    ids = _routing_with_counts(counts, num_tokens, shape.experts, shape.top_k)
    # the counted experts are the rank's first ones; under EP the others belong to other ranks
    ids = torch.where(ids < len(counts), ids + start, (ids + start + local) % shape.experts)
    ids = ids.to(torch.int32).cuda()
    weights = torch.rand(num_tokens, shape.top_k, device="cuda")
    hidden = _hidden(num_tokens, shape.hidden)
    plan = dispatch.plan_moe(num_tokens, shape.top_k, local, shape.hidden,
                             shape.intermediate, global_num_experts=shape.experts,
                             block_m=block_m, hot=False)
    wgs = {g: getattr(plan, g).config.row_wgs for g in ("gate_up", "down")}
    assert wgs == {g: dispatch.grouped_row_wgs(block_m, getattr(plan, g).config.k)
                   for g in wgs} and 4 in wgs.values(), wgs
    two = with_config_fields(plan, {"row_wgs": 2})
    _check_plan_and_variant(shape, experts, hidden, ids, weights, plan, two,
                            f"{shape_name} ep{ep} bm{block_m} four row warpgroups vs two",
                            start)


@pytest.mark.parametrize("shape_name,num_tokens,block_m,hot", [
    ("tiny", 512, 16, False), ("v4-flash", 512, 16, False), ("v4-flash", 2048, 64, False),
    ("v4-pro", 2048, 64, False), ("v4-flash", 4096, 128, True)])
def test_unrolled_k_loop_equals_rolled(shape_name, num_tokens, block_m, hot):
    """Every WGMMA GEMM of a plan with its consumers' k loop unrolled by the ring depth
    (``WgmmaConfig.unroll``) gives the reference's output and bitwise that of the same plan
    with every GEMM rolled
    (tiny: K = 128 / 256, fewer middle tiles than stages; V4: whole rounds and a remainder;
    the 16-, 64- (two and four row warpgroups), 128- and 256-row tiles),
    under skewed routing."""
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.testing import fast_random_experts, with_config_fields

    shape = nvfp4_ops.get_shape(shape_name)
    experts = fast_random_experts(shape.experts, shape.hidden, shape.intermediate,
                                  device="cuda", seed=11)
    ids, weights = make_routing("skew", num_tokens, shape.experts, shape.top_k, seed=3)
    ids, weights = ids.cuda(), weights.cuda()
    hidden = _hidden(num_tokens, shape.hidden)
    plan = dispatch.plan_moe(num_tokens, shape.top_k, shape.experts, shape.hidden,
                             shape.intermediate, block_m=block_m, hot=hot)
    # both forms set explicitly: the dispatch unrolls some shapes' GEMMs itself
    unrolled = with_config_fields(plan, {"unroll": True})
    rolled = with_config_fields(plan, {"unroll": False})
    for form, want_unroll in ((unrolled, True), (rolled, False)):
        gemms = [form.gate_up, form.down]
        gemms += [form.hot.gate_up, form.hot.down] if hot else []
        assert all(g.family == "wgmma" and g.config.unroll == want_unroll
                   for g in gemms), gemms

    _check_plan_and_variant(shape, experts, hidden, ids, weights, unrolled, rolled,
                            f"{shape_name} T={num_tokens} bm={block_m} unrolled vs rolled")


@pytest.mark.parametrize("shape_name,ep,num_tokens", [
    ("v4-flash", 1, 1), ("v4-flash", 1, 8), ("v4-flash", 8, 1), ("v4-pro", 1, 37),
    ("v4-pro", 8, 128)])
def test_tma2d_decode_tiles_equal_bulk_copies(shape_name, ep, num_tokens):
    """The streamed decode tiles filling their stages with TMA tensor copies
    (``StreamConfig.tma2d``: one box per operand and 16-row set, one tensor map over every
    local expert's rows) give the reference's output and bitwise that of the same plan with
    per-row bulk copies: persistent gate/up CTAs at T = 1, one-item CTAs above, the down
    GEMM's four-warp tile of an EP 8 rank at T = 1, global ids on other ranks' experts."""
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.testing import ep_slice, fast_random_experts, with_config_fields

    shape = nvfp4_ops.get_shape(shape_name)
    start, local = ep_slice(shape.experts, ep)
    experts = fast_random_experts(local, shape.hidden, shape.intermediate, device="cuda",
                                  first_expert=start, seed=5)
    ids, weights = make_routing("uniform", num_tokens, shape.experts, shape.top_k, seed=4)
    if ep > 1:  # the first token on this rank's experts, so every cell has local rows
        ids[0] = torch.arange(start, start + shape.top_k, dtype=ids.dtype)
    ids, weights = ids.cuda(), weights.cuda()
    hidden = _hidden(num_tokens, shape.hidden)
    plan = dispatch.plan_moe(num_tokens, shape.top_k, local, shape.hidden, shape.intermediate,
                             global_num_experts=shape.experts)
    assert plan.block_m == 8 and plan.gate_up.family == plan.down.family == "stream", plan
    assert plan.gate_up.config.tma2d and not plan.down.config.tma2d  # the dispatch's choice
    t2 = with_config_fields(plan, {"tma2d": True})
    bulk = with_config_fields(plan, {"tma2d": False})
    _check_plan_and_variant(shape, experts, hidden, ids, weights, t2, bulk,
                            f"{shape_name} ep{ep} T={num_tokens} tma2d vs bulk copies", start)


@pytest.mark.parametrize("shape_name,routing", [
    ("v4-flash", "uniform"), ("v4-flash", "local"), ("v4-flash", "six"), ("v4-pro", "uniform"),
    ("v4-pro", "six")])
def test_capped_down_tiles_equal_one_cta_per_item(shape_name, routing):
    """An EP 8 rank's down GEMM at T = 128 walks its token tiles with persistent CTAs capped
    at ``dispatch.DOWN_TILES_CAP`` tiles per feature tile: the reference's output and bitwise
    that of one CTA per grid item, under uniform routing (about as many real tiles as the
    cap), with every slot on this rank's experts (``local``: more real tiles than the cap, so
    CTAs walk several) and every token on the same six local experts (``six``: 16 tiles
    each)."""
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.testing import ep_slice, fast_random_experts, with_config_fields

    num_tokens, shape = 128, nvfp4_ops.get_shape(shape_name)
    start, local = ep_slice(shape.experts, 8)
    experts = fast_random_experts(local, shape.hidden, shape.intermediate, device="cuda",
                                  first_expert=start, seed=6)
    ids, weights = make_routing("uniform", num_tokens, shape.experts, shape.top_k, seed=7)
    if routing == "local":
        ids = start + torch.argsort(torch.rand(num_tokens, local), dim=1)[:, :shape.top_k]
    elif routing == "six":
        ids = (start + 3 + torch.arange(shape.top_k)).expand(num_tokens, -1)
    ids, weights = ids.to(torch.int32).contiguous().cuda(), weights.cuda()
    hidden = _hidden(num_tokens, shape.hidden)
    plan = dispatch.plan_moe(num_tokens, shape.top_k, local, shape.hidden, shape.intermediate,
                             global_num_experts=shape.experts)
    feature_tiles = shape.hidden // 16
    assert plan.block_m == 8 and plan.down.family == "stream", plan
    assert plan.down.config.ctas == feature_tiles * dispatch.DOWN_TILES_CAP, plan.down.config
    assert plan.num_rows // 8 >= 2 * dispatch.DOWN_TILES_CAP
    one_per_item = with_config_fields(plan, {"ctas": 0}, where={"epilogue": "row_scale"})
    assert one_per_item.down.config.ctas == 0
    _check_plan_and_variant(shape, experts, hidden, ids, weights, plan, one_per_item,
                            f"{shape_name} ep8 T={num_tokens} {routing} capped vs one per item",
                            start)


def test_hot_tiles_cuda_graph_replay_with_new_routing(flash):
    """One graph at a size with a hot tile, replayed with routings that use no hot expert,
    some, and only hot experts: every replay equals the eager call and the reference."""

    num_tokens = 1024
    nvfp4_ops.warmup(["v4-flash"])
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids, weights = make_routing("uniform", num_tokens, FLASH.experts, FLASH.top_k, seed=1)
    ids, weights = ids.cuda(), weights.cuda()

    def call():
        return nvfp4_ops.moe(hidden, ids, weights, *flash.args(),
                             swiglu_limit=FLASH.swiglu_limit, output_scale=1.5)

    graph, static_out = capture_graph(call)
    seen = []
    for step, kind in enumerate(["uniform", "skew", "all_hot"]):
        if kind == "all_hot":
            new_ids = torch.arange(FLASH.top_k, dtype=torch.int32).expand(num_tokens, -1) + 40
            new_weights = torch.rand(num_tokens, FLASH.top_k)
        else:
            new_ids, new_weights = make_routing(kind, num_tokens, FLASH.experts, FLASH.top_k,
                                                seed=10 + step)
        hidden.copy_(_hidden(num_tokens, FLASH.hidden))
        ids.copy_(new_ids)
        weights.copy_(new_weights)
        seen.append(_hot_tiles_used(num_tokens, ids, FLASH.experts)[1])
        graph.replay()
        eager = call()
        assert torch.equal(static_out, eager), f"replay {kind} != eager"
        want = moe_reference(hidden, ids, weights, *flash.args(), 0, FLASH.swiglu_limit, 1.5)
        assert_moe_close(static_out, want, f"graph replay {kind}")
    assert seen == [False, True, True], f"hot tiles used per step: {seen}"


@pytest.mark.parametrize("num_tokens", [1, 7, 199])
def test_expert_parallel_mixed_ids(tiny, num_tokens):
    """Local experts [16, 32) of 64 global: non-local slots contribute nothing; a token whose
    experts are all remote gets exactly 0."""
    torch.manual_seed(40 + num_tokens)
    start = 16
    hidden = _hidden(num_tokens, TINY.hidden)
    ids, weights = random_routing(num_tokens, 64, TINY.top_k, device="cuda")
    ids[0] = torch.tensor([0, 1, 2, 40, 50, 63], device="cuda", dtype=ids.dtype)
    got, want = _run(TINY, tiny, hidden, ids, weights, expert_start=start)
    assert torch.equal(got[0], torch.zeros_like(got[0])), "token with no local expert"
    assert_moe_close(got, want, f"EP start={start} T={num_tokens}")
    # the same call with global_num_experts given: ids stay in range; the tile may be smaller
    # (sized for this rank's share of the slots), so equal up to fp32 summation order
    again = nvfp4_ops.moe(hidden, ids, weights, *tiny.args(), expert_start=start,
                          global_num_experts=64, swiglu_limit=TINY.swiglu_limit,
                          output_scale=1.5)
    assert torch.equal(again[0], torch.zeros_like(again[0]))
    assert_moe_close(again, want, f"EP start={start} T={num_tokens}, global count given")


@pytest.mark.parametrize("num_tokens,all_local", [(128, False), (512, False), (4096, False),
                                                  (512, True)])
def test_flash_ep8_rank(flash, num_tokens, all_local):
    """One rank of EP 8 on V4-Flash (experts [32, 64) of 256, global ids): the tile is sized
    for the rank's expected 1/8 of the slots. ``all_local``: every slot lands on this rank
    (8x the estimate), so each expert needs many tiles; still exact."""
    from nvfp4_ops.kernels import dispatch

    torch.manual_seed(45 + num_tokens)
    start, local = 32, 32
    rank = type(flash)(*(t[start:start + local] for t in flash.args()))
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids, weights = random_routing(num_tokens, local if all_local else FLASH.experts,
                                  FLASH.top_k, device="cuda",
                                  expert_start=start if all_local else 0)
    args = (hidden, ids, weights, *rank.args())
    got = nvfp4_ops.moe(*args, expert_start=start, global_num_experts=FLASH.experts,
                        swiglu_limit=FLASH.swiglu_limit, output_scale=1.5)
    want = moe_reference(*args, start, FLASH.swiglu_limit, 1.5)
    plan = dispatch.plan_moe(num_tokens, FLASH.top_k, local, FLASH.hidden, FLASH.intermediate,
                             global_num_experts=FLASH.experts)
    assert_moe_close(got, want, f"EP 8 rank T={num_tokens} all_local={all_local} bm={plan.block_m}")


@pytest.mark.parametrize("num_tokens", [1, 8, 37, 128])
def test_flash_decode_pair_order_matches_natural(flash, num_tokens):
    """At decode the op runs both grouped GEMMs on the streamed 8-token tiles with pair-order
    activations (the gather and GEMM 1's epilogue write them; orders/kperm.py). The B
    fragment holds the same k pairs as in the natural order, so the output is bitwise the
    natural-order data flow's; the op itself takes the pair path and matches the reference."""
    from nvfp4_ops.kernels import dispatch, moe_cuda

    sizes = (num_tokens, FLASH.top_k, FLASH.experts, FLASH.hidden, FLASH.intermediate)
    plan = dispatch.plan_moe(*sizes)
    assert plan.block_m == 8 and plan.act_order == "pair"
    torch.manual_seed(45 + num_tokens)
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids, weights = random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda")
    outs = {}
    for kperm in (False, True):
        _poison_allocator(2**28)
        outs[kperm] = moe_cuda.moe_forward(
            hidden, ids, weights, *flash.args(), 0, FLASH.swiglu_limit, 1.5,
            plan=dispatch.plan_moe(*sizes, permuted=kperm, chained=False))
    assert torch.equal(outs[True], outs[False]), "pair order differs from natural"
    got, want = _run(FLASH, flash, hidden, ids, weights)
    assert torch.equal(got, outs[True]), "the op did not match its pair-order data flow"
    assert_moe_close(got, want, f"v4-flash pair order T={num_tokens}")


def _replays_equal_eager(run, hidden, ids, weights, seed, replays=6):
    """``run(variant, hidden, ids, weights)`` on V4-Flash-sized inputs: ``run(True, ...)``
    captured in a CUDA graph and replayed with new hidden states and new routing each time
    (output poisoned with NaN before each replay) is bitwise ``run(False, ...)`` run eagerly
    on the same inputs."""
    num_tokens = hidden.shape[0]
    h_s, i_s, w_s = hidden.clone(), ids.clone(), weights.clone()
    run(True, h_s, i_s, w_s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_s = run(True, h_s, i_s, w_s)
    for r in range(replays):
        torch.manual_seed(seed + r)
        h_s.copy_(_hidden(num_tokens, FLASH.hidden))
        new_ids, new_w = random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda")
        i_s.copy_(new_ids)
        w_s.copy_(new_w)
        y_s.fill_(float("nan"))
        graph.replay()
        assert torch.equal(y_s, run(False, h_s, i_s, w_s)), f"replay {r} differs from eager"


@pytest.mark.parametrize("num_tokens,expert_start",
                         [(1, 0), (8, 0), (37, 0), (8, 256), (512, 0), (512, 256)])
def test_flash_launch_overlap_matches_plain(flash, num_tokens, expert_start):
    """The op launches its chain with programmatic dependent launch (moe_cuda, "Launch
    overlap"): the streamed GEMMs read tile_expert and stream weights before waiting for the
    previous kernel. Bitwise equal to the plainly launched chain, eagerly and over CUDA-graph
    replays with new hidden states and new routing each time (a kernel reading a buffer too
    early would differ); T = 512 runs the WGMMA tiles. ``expert_start = 256``: no id is local,
    every tile is skipped and the output must be exactly 0 (only CTA 0 of each GEMM waits
    then)."""
    from nvfp4_ops.kernels import dispatch, moe_cuda

    sizes = (num_tokens, FLASH.top_k, FLASH.experts, FLASH.hidden, FLASH.intermediate)
    assert dispatch.plan_moe(*sizes).block_m == (8 if num_tokens < 64 else 16)
    torch.manual_seed(70 + num_tokens)
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids, weights = random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda")

    def run(pdl, h=hidden, i=ids, w=weights):
        plan = dispatch.plan_moe(*sizes, chained=pdl)
        return moe_cuda.moe_forward(h, i, w, *flash.args(), expert_start, FLASH.swiglu_limit,
                                    1.5, plan=plan)

    _poison_allocator(2**28)
    plain = run(False)
    _poison_allocator(2**28)
    assert torch.equal(run(True), plain), "PDL chain differs from the plain one"
    if expert_start:
        assert torch.equal(plain, torch.zeros_like(plain))
    else:
        want = moe_reference(hidden, ids, weights, *flash.args(), 0, FLASH.swiglu_limit, 1.5)
        assert_moe_close(plain, want, f"v4-flash T={num_tokens}")
    _replays_equal_eager(run, hidden, ids, weights, seed=700)


@pytest.mark.parametrize("expert_start,num_experts", [(0, 256), (96, 32), (0, 32)])
def test_flash_direct_routing_equals_one_cta(flash, expert_start, num_experts, monkeypatch):
    """A one-token call routed by the direct kernel (``moe_routing.DIRECT_ROUTING``) gives
    bitwise the one-CTA kernel's output, eagerly and over CUDA-graph replays with new hidden
    states and new routing, with launch overlap (the GEMMs read its tile list before they
    wait); on EP slices (32 local experts in the middle, and at the start) too."""
    from nvfp4_ops.kernels import dispatch, moe_cuda
    from nvfp4_ops.kernels.triton import moe_routing

    sizes = (1, FLASH.top_k, num_experts, FLASH.hidden, FLASH.intermediate)
    plan = dispatch.plan_moe(*sizes, chained=True, global_num_experts=FLASH.experts)
    assert moe_routing.direct_routing_fits(FLASH.top_k, plan.block_m, None)
    args = [a[expert_start:expert_start + num_experts] for a in flash.args()]
    torch.manual_seed(80 + expert_start)
    hidden = _hidden(1, FLASH.hidden)
    ids, weights = random_routing(1, FLASH.experts, FLASH.top_k, device="cuda")

    def run(direct, h=hidden, i=ids, w=weights):
        monkeypatch.setattr(moe_routing, "DIRECT_ROUTING", direct)
        moe_cuda._reused.clear()  # eager repeats keep their bound launches: bind afresh
        return moe_cuda.moe_forward(h, i, w, *args, expert_start, FLASH.swiglu_limit, 1.5,
                                    plan=plan)

    monkeypatch.setattr(moe_routing, "DIRECT_ROUTING", True)
    _, launch = moe_routing.routing_launch(ids, num_experts, expert_start, plan.block_m, True)
    assert launch.launcher is moe_routing._direct_routing
    got = run(True)
    assert torch.equal(got, run(False)), "direct routing differs from the one-CTA one"
    want = moe_reference(hidden, ids, weights, *args, expert_start, FLASH.swiglu_limit, 1.5)
    assert_moe_close(got, want, f"direct routing, experts [{expert_start}, +{num_experts})")
    _replays_equal_eager(run, hidden, ids, weights, seed=800)


def test_deterministic(flash):
    """Rows inside an expert segment are placed by atomics; the output must not care."""
    torch.manual_seed(50)
    hidden = _hidden(199, FLASH.hidden)
    ids, weights = random_routing(199, FLASH.experts, FLASH.top_k, device="cuda")
    outs = [nvfp4_ops.moe(hidden, ids, weights, *flash.args(), swiglu_limit=10.0)
            for _ in range(3)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("shape_name", ["tiny", "v4-flash"])
def test_cuda_graph_replay_with_new_routing(tiny, flash, shape_name):
    shape, experts = (TINY, tiny) if shape_name == "tiny" else (FLASH, flash)
    nvfp4_ops.warmup([shape_name])
    num_tokens = 37
    torch.manual_seed(60)
    hidden = _hidden(num_tokens, shape.hidden)
    ids, weights = random_routing(num_tokens, shape.experts, shape.top_k, device="cuda")

    def call():
        return nvfp4_ops.moe(hidden, ids, weights, *experts.args(),
                             swiglu_limit=shape.swiglu_limit, output_scale=1.5)

    # eager run on the capture stream's allocator path
    graph, static_out = capture_graph(call)
    previous = None
    for step in range(3):
        new_ids, new_weights = random_routing(num_tokens, shape.experts, shape.top_k,
                                              device="cuda")
        if step == 2:  # a skewed routing: everything to two experts
            new_ids[:, :] = torch.tensor([3, 4] * (shape.top_k // 2), device="cuda",
                                         dtype=new_ids.dtype)
        hidden.copy_(_hidden(num_tokens, shape.hidden))
        ids.copy_(new_ids)
        weights.copy_(new_weights)
        graph.replay()
        eager = call()
        assert torch.equal(static_out, eager), f"replay {step} != eager"
        if previous is not None:
            assert not torch.equal(static_out, previous), "replay output did not change"
        previous = static_out.clone()
        want = moe_reference(hidden, ids, weights, *experts.args(), 0, shape.swiglu_limit, 1.5)
        assert_moe_close(static_out, want, f"graph replay {step}")


def test_torch_compile_fullgraph_dynamic_tokens(tiny):
    torch._dynamo.reset()

    def layer(hidden, ids, weights):
        return nvfp4_ops.moe(hidden, ids, weights, *tiny.args(), swiglu_limit=10.0,
                             output_scale=1.5)

    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for num_tokens in (5, 37, 1, 130):
        torch.manual_seed(70 + num_tokens)
        hidden = _hidden(num_tokens, TINY.hidden)
        ids, weights = random_routing(num_tokens, TINY.experts, TINY.top_k, device="cuda")
        for t in (hidden, ids, weights):
            torch._dynamo.mark_dynamic(t, 0)
        assert torch.equal(compiled(hidden, ids, weights), layer(hidden, ids, weights)), (
            f"T={num_tokens}")


def test_opcheck_cuda(tiny):
    torch.manual_seed(80)
    hidden = _hidden(9, TINY.hidden)
    ids, weights = random_routing(9, TINY.experts, TINY.top_k, device="cuda")
    w13, w13_scale, w13_global, w2, w2_scale, w2_global = tiny.args()
    # Block scales as their raw uint8 bytes (the op accepts both): opcheck's schema check
    # compares inputs with arithmetic that CUDA does not implement for float8_e4m3fn.
    args = (hidden, ids, weights, w13, w13_scale.view(torch.uint8), w13_global, w2,
            w2_scale.view(torch.uint8), w2_global, 0, -1, 10.0, 1.5)
    torch.library.opcheck(torch.ops.nvfp4.moe.default, args)
    e4m3 = nvfp4_ops.moe(hidden, ids, weights, *tiny.args(), swiglu_limit=10.0,
                         output_scale=1.5)
    assert torch.equal(torch.ops.nvfp4.moe(*args), e4m3)


def test_zero_tokens(tiny):
    hidden = torch.empty(0, TINY.hidden, dtype=torch.bfloat16, device="cuda")
    ids = torch.empty(0, TINY.top_k, dtype=torch.int32, device="cuda")
    weights = torch.empty(0, TINY.top_k, device="cuda")
    out = nvfp4_ops.moe(hidden, ids, weights, *tiny.args())
    assert out.shape == (0, TINY.hidden) and out.dtype == torch.bfloat16


def test_bad_inputs_raise_before_launch(tiny):
    torch.manual_seed(90)
    hidden = _hidden(4, TINY.hidden)
    ids, weights = random_routing(4, TINY.experts, TINY.top_k, device="cuda")
    w = tiny.args()
    bad_ids = ids.clone()
    bad_ids[1, 2] = TINY.experts  # out of the global range
    # ids are device data: checked per call only with the debug switch (NVFP4_OPS_VALUE_CHECKS);
    # without it the kernels drop ids no rank owns (test_expert_parallel_mixed_ids)
    nvfp4_ops.set_value_checks(True)
    try:
        for what, bad in (("id out of range", bad_ids), ("negative id", -ids)):
            with pytest.raises(nvfp4_ops.NVFP4InputError, match="topk_ids"):
                nvfp4_ops.moe(hidden, bad, weights, *w, global_num_experts=TINY.experts)
                pytest.fail(f"no error for {what}")
    finally:
        nvfp4_ops.set_value_checks(None)
    cases = {
        "fp16 hidden": ((hidden.half(), ids, weights, *w), {}),
        "bf16 weights": ((hidden, ids, weights.bfloat16(), *w), {}),
        "float ids": ((hidden, ids.float(), weights, *w), {}),
        "T mismatch": ((hidden[:3], ids, weights, *w), {}),
        "weights on cpu": ((hidden, ids, weights, w[0].cpu(), *w[1:]), {}),
        "w13_global shape": ((hidden, ids, weights, *w[:2], w[2][:, :1].contiguous(), *w[3:]),
                             {}),
    }
    for what, (args, kw) in cases.items():
        with pytest.raises(nvfp4_ops.NVFP4InputError):
            nvfp4_ops.moe(*args, **kw)
            pytest.fail(f"no error for {what}")
        torch.cuda.synchronize()  # and the device is still fine


@pytest.fixture(scope="module")
def flash_wperm(flash):
    """The V4-Flash experts with their codes in the ``wperm`` bit order (nvfp4::to_wperm_)."""
    w13, w2 = flash.w13.clone(), flash.w2.clone()
    nvfp4_ops.to_wperm_(w13)
    nvfp4_ops.to_wperm_(w2)
    return (w13, flash.w13_scale, flash.w13_global, w2, flash.w2_scale, flash.w2_global)


@pytest.mark.parametrize("num_tokens", [1, 8, 37, 128, 199, 1024, 4096])
def test_flash_wperm_weights_bitwise_equal(flash, flash_wperm, num_tokens):
    """``wperm=True`` with permuted weights: the decoders give the same registers, so the op is
    bitwise equal to the checkpoint order at every tile (8-token streamed, WGMMA 16-256)."""
    from nvfp4_ops.kernels import dispatch

    assert dispatch.moe_wperm_supported(FLASH.hidden, FLASH.intermediate)
    torch.manual_seed(90 + num_tokens)
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids, weights = random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda")
    kw = dict(swiglu_limit=FLASH.swiglu_limit, output_scale=1.5)
    want = nvfp4_ops.moe(hidden, ids, weights, *flash.args(), **kw)
    _poison_allocator(8 * (num_tokens * FLASH.top_k + 64 * FLASH.experts)
                      * (FLASH.hidden + FLASH.intermediate) + 2**20)
    got = nvfp4_ops.moe(hidden, ids, weights, *flash_wperm, wperm=True, **kw)
    assert torch.equal(got, want)
    # and reading permuted codes as checkpoint codes is a different (wrong) answer
    assert not torch.equal(nvfp4_ops.moe(hidden, ids, weights, *flash_wperm, **kw), want)


def test_flash_wperm_cuda_graph_replay(flash, flash_wperm):
    """Captured once with ``wperm=True``, replayed with new hidden states and routing: equal to
    the eager checkpoint-order op every time."""
    nvfp4_ops.warmup(["v4-flash"])
    num_tokens = 8
    torch.manual_seed(95)
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids, weights = random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda")
    kw = dict(swiglu_limit=FLASH.swiglu_limit, output_scale=1.5)

    def call():
        return nvfp4_ops.moe(hidden, ids, weights, *flash_wperm, wperm=True, **kw)

    graph, static_out = capture_graph(call)
    for step in range(3):
        new_ids, new_weights = random_routing(num_tokens, FLASH.experts, FLASH.top_k,
                                              device="cuda")
        hidden.copy_(_hidden(num_tokens, FLASH.hidden))
        ids.copy_(new_ids)
        weights.copy_(new_weights)
        graph.replay()
        want = nvfp4_ops.moe(hidden, ids, weights, *flash.args(), **kw)
        assert torch.equal(static_out, want), f"replay {step}"


def test_wperm_unsupported_sizes_refused_on_cuda(tiny):
    """Where some tile's kernel cannot read the order, ``wperm=True`` is a clear error, not a
    wrong answer (tiny: checked against dispatch.moe_wperm_supported)."""
    from nvfp4_ops.kernels import dispatch

    hidden = _hidden(3, TINY.hidden)
    ids, weights = random_routing(3, TINY.experts, TINY.top_k, device="cuda")
    if dispatch.moe_wperm_supported(TINY.hidden, TINY.intermediate):
        pytest.skip("tiny's kernels read wperm")
    if not dispatch.moe_supported(TINY.hidden, TINY.intermediate):
        pytest.skip("tiny runs the reference, which reads wperm")
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="wperm"):
        nvfp4_ops.moe(hidden, ids, weights, *tiny.args(), swiglu_limit=10.0, wperm=True)


@pytest.mark.parametrize("num_tokens", [1, 8, 199, 1024])
def test_flash_per_row_global_scales(flash, num_tokens):
    """One global scale per weight row (``w13_global [E, 2I]``, ``w2_global [E, H]``: the exact
    MXFP4 conversion's form) through the same kernels: matches the reference, and rows holding
    the per-expert scales give bitwise the per-expert result."""
    e, two_i = flash.w13.shape[:2]
    gen = torch.Generator(device="cuda").manual_seed(5)
    g13 = flash.w13_global.repeat_interleave(two_i // 2, dim=1)
    g2 = flash.w2_global.unsqueeze(1).expand(-1, FLASH.hidden).contiguous()
    rows = type(flash)(**{**flash.__dict__,
                          "w13_global": g13 * torch.rand(e, two_i, device="cuda",
                                                         generator=gen).add(0.5),
                          "w2_global": g2 * torch.rand(e, FLASH.hidden, device="cuda",
                                                       generator=gen).add(0.5)})
    torch.manual_seed(40 + num_tokens)
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids, weights = random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda")
    got, want = _run(FLASH, rows, hidden, ids, weights)
    assert_moe_close(got, want, f"v4-flash per-row globals T={num_tokens}")
    expanded = type(flash)(**{**flash.__dict__, "w13_global": g13, "w2_global": g2})
    got_expanded, _ = _run(FLASH, expanded, hidden, ids, weights)
    got_plain, _ = _run(FLASH, flash, hidden, ids, weights)
    assert torch.equal(got_expanded, got_plain)


def _poison_reused():
    """NaN in every float buffer the eager calls keep: a row a kernel forgets to write in a
    later call shows up as NaN instead of as the previous call's value."""
    from nvfp4_ops.kernels import moe_cuda

    for entry in moe_cuda._reused.values():
        bufs = entry.bufs
        for t in (bufs.a, bufs.row_scale, bufs.act):
            t.fill_(float("nan"))


@pytest.mark.parametrize("num_tokens", [1, 7])
def test_eager_calls_reuse_buffers_exactly(flash, num_tokens, monkeypatch):
    """Eager calls of one size on one stream share their intermediates: each call's result is
    bitwise the one with fresh buffers, an earlier result is left alone, another stream gets
    buffers of its own, and a CUDA-graph capture takes none."""
    from nvfp4_ops.kernels import moe_cuda

    kw = dict(global_num_experts=FLASH.experts, swiglu_limit=FLASH.swiglu_limit)
    calls = []
    for seed in range(3):
        torch.manual_seed(100 + seed)
        hidden = _hidden(num_tokens, FLASH.hidden)
        ids, weights = random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda")
        calls.append((hidden, ids, weights, *flash.args()))
    first = nvfp4_ops.moe(*calls[0], **kw)
    first_copy = first.clone()
    plan = moe_cuda.dispatch.plan_moe(num_tokens, FLASH.top_k, FLASH.experts, FLASH.hidden,
                                      FLASH.intermediate, global_num_experts=FLASH.experts)
    # key: (device, stream, P, block_m, N, E, H, I)
    assert any(key[2:5] == (plan.num_rows, plan.block_m, num_tokens * FLASH.top_k)
               for key in moe_cuda._reused), "the eager call kept no buffers"
    _poison_reused()
    reused = [nvfp4_ops.moe(*args, **kw) for args in calls[1:]]
    side = torch.cuda.Stream()
    entries = len(moe_cuda._reused)
    with torch.cuda.stream(side):
        on_side = nvfp4_ops.moe(*calls[2], **kw)
    torch.cuda.current_stream().wait_stream(side)
    assert len(moe_cuda._reused) == entries + 1, "a second stream shared the first's buffers"
    monkeypatch.setattr(moe_cuda, "_REUSE_MAX", -1)  # fresh buffers from here on
    fresh = [nvfp4_ops.moe(*args, **kw) for args in calls[1:]]
    for got, want in zip(reused, fresh, strict=True):
        assert torch.equal(got, want)
    assert torch.equal(on_side, fresh[1])
    assert torch.equal(first, first_copy), "a later call wrote into an earlier result"
    want = moe_reference(*calls[2], 0, FLASH.swiglu_limit, 1.0)
    assert_moe_close(reused[1], want, f"v4-flash T={num_tokens}, reused buffers")
    monkeypatch.undo()
    entries = len(moe_cuda._reused)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nvfp4_ops.moe(*calls[0], **kw)
    assert len(moe_cuda._reused) == entries, "a capture took the eager buffers"


def test_eager_calls_follow_weight_updates(tiny):
    """Eager calls reuse their weight views (``linear_cuda.memo_views``): a global scale whose
    storage was swapped through ``.data`` (what vLLM's loaders do) is seen by the next call,
    exactly (a power-of-two scale moves every output by that power of two)."""
    from dataclasses import replace

    torch.manual_seed(5)
    experts = replace(tiny, w2_global=tiny.w2_global.clone())
    hidden = _hidden(4, TINY.hidden)
    ids, weights = random_routing(4, TINY.experts, TINY.top_k, device="cuda")
    kw = dict(swiglu_limit=TINY.swiglu_limit)
    first = nvfp4_ops.moe(hidden, ids, weights, *experts.args(), **kw)
    experts.w2_global.data = experts.w2_global * 2.0
    second = nvfp4_ops.moe(hidden, ids, weights, *experts.args(), **kw)
    assert torch.equal(second.float(), first.float() * 2)
    want = moe_reference(hidden, ids, weights, *experts.args(), 0, TINY.swiglu_limit, 1.0)
    assert_moe_close(second, want, "tiny T=4 after a .data swap of w2_global")


def test_eager_bound_launches_follow_new_argument_kinds(flash):
    """Repeated eager calls launch their Triton kernels bound to the reused buffers; a later
    call with ids of another dtype, an unaligned hidden state or another ``expert_start``
    still computes exactly what a call with fresh buffers computes."""
    from nvfp4_ops.kernels import moe_cuda

    num_tokens = 3
    kw = dict(global_num_experts=FLASH.experts, swiglu_limit=FLASH.swiglu_limit)
    torch.manual_seed(7)
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids, weights = random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda")
    nvfp4_ops.moe(hidden, ids.int(), weights, *flash.args(), **kw)  # binds the launches
    flat = torch.empty(num_tokens * FLASH.hidden + 1, dtype=torch.bfloat16, device="cuda")
    unaligned = flat[1:].view(num_tokens, FLASH.hidden)
    unaligned.copy_(hidden)
    cases = [(hidden, ids.long(), 0), (unaligned, ids.int(), 0), (hidden, ids.int(), 0)]
    # a local slice of the experts that holds every id, seen from a larger id space
    start = 5
    shifted = dict(kw, global_num_experts=FLASH.experts + start)
    got = [nvfp4_ops.moe(h, i, weights, *flash.args(), expert_start=s, **kw)
           for h, i, s in cases]
    got_shifted = nvfp4_ops.moe(hidden, ids.int() + start, weights, *flash.args(),
                                expert_start=start, **shifted)
    assert any(e.launches is not None for e in moe_cuda._reused.values())
    fresh = moe_cuda._REUSE_MAX
    try:
        moe_cuda._REUSE_MAX = -1
        want = [nvfp4_ops.moe(h, i, weights, *flash.args(), expert_start=s, **kw)
                for h, i, s in cases]
        want_shifted = nvfp4_ops.moe(hidden, ids.int() + start, weights, *flash.args(),
                                     expert_start=start, **shifted)
    finally:
        moe_cuda._REUSE_MAX = fresh
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert torch.equal(got_shifted, want_shifted)
    assert torch.equal(got[0], got[2]) and torch.equal(got_shifted, got[2])


def test_eager_gemm_graphs_replay_exactly(flash, monkeypatch):
    """Repeated eager calls replay their GEMMs from the graph the first call captured
    (``moe_cuda._EagerCall``): bitwise what launching them one by one gives, with new
    routing and activations, after the weights change in place (the graph reads them then),
    after a weight's storage moves (a new key, a new capture) and at another SwiGLU limit."""
    from nvfp4_ops.kernels import eager_graphs, moe_cuda

    num_tokens = 2
    kw = dict(global_num_experts=FLASH.experts)
    torch.manual_seed(11)
    calls = []
    for _ in range(3):
        hidden = _hidden(num_tokens, FLASH.hidden)
        ids, weights = random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda")
        calls.append((hidden, ids, weights))
    experts = type(flash)(**{**flash.__dict__, "w2_global": flash.w2_global.clone(),
                             "w13_scale": flash.w13_scale.clone()})

    def run(args, limit=FLASH.swiglu_limit):
        return nvfp4_ops.moe(*args, *experts.args(), swiglu_limit=limit, **kw)

    def roll_scales(shift):  # new block-scale values, in place (the bytes: float8 has no roll)
        raw = experts.w13_scale.view(torch.uint8)
        raw.copy_(torch.roll(raw, shift, dims=1))

    got = [run(calls[0])]
    assert any(c.gemm_graph is not None for e in moe_cuda._reused.values()
               for c in e.calls.values()), "the first eager call captured no graph"
    got.append(run(calls[1]))
    roll_scales(1)
    got.append(run(calls[2]))
    experts.w2_global.data = experts.w2_global * 0.5  # the storage moves
    got.append(run(calls[0]))
    got.append(run(calls[1], limit=2.5))
    monkeypatch.setattr(eager_graphs, "ENABLED", False)
    roll_scales(-1)
    experts.w2_global.data = experts.w2_global * 2.0
    want = [run(calls[0]), run(calls[1])]
    roll_scales(1)
    want.append(run(calls[2]))
    experts.w2_global.data = experts.w2_global * 0.5
    want += [run(calls[0]), run(calls[1], limit=2.5)]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"eager call {i}: graph replay != one-by-one launches"
    ref = moe_reference(*calls[1], *experts.args(), 0, 2.5, 1.0)
    assert_moe_close(got[-1], ref, "v4-flash T=2, graph-replayed GEMMs")


def _whole_call_captures() -> int:
    from nvfp4_ops.kernels import moe_cuda

    return sum(c.whole.captures for e in moe_cuda._reused.values() for c in e.calls.values())


def test_eager_whole_call_graphs_replay_exactly(flash, monkeypatch):
    """Repeated eager calls whose inputs and output sit at an earlier call's addresses replay
    the whole call (routing, gather, GEMMs, combine) from a graph
    (``eager_graphs.AddressGraphs``): new activations and routing written into the same
    tensors each call, each output freed before the next call, at T = 1 and 5 and with int32
    and int64 ids: bitwise what the same calls give with the graphs off, and close to the
    reference."""
    from nvfp4_ops.kernels import eager_graphs

    torch.manual_seed(12)
    kw = dict(global_num_experts=FLASH.experts, swiglu_limit=FLASH.swiglu_limit)
    for num_tokens in (1, 5):
        rounds = [(_hidden(num_tokens, FLASH.hidden),
                   *random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda"))
                  for _ in range(6)]
        for dtype in (torch.int64, torch.int32):
            hidden = torch.empty_like(rounds[0][0])
            ids = torch.empty(rounds[0][1].shape, dtype=dtype, device="cuda")
            weights = torch.empty_like(rounds[0][2])

            def run_all(rounds=rounds, hidden=hidden, ids=ids, weights=weights):
                outs = []
                for h, i, w in rounds:
                    hidden.copy_(h)
                    ids.copy_(i)
                    weights.copy_(w)
                    out = nvfp4_ops.moe(hidden, ids, weights, *flash.args(), **kw)
                    outs.append(out.clone())
                    del out  # free: the next call may get the same address
                return outs

            before = _whole_call_captures()
            got = run_all()
            assert _whole_call_captures() > before, (
                f"T={num_tokens} {dtype}: no whole call was captured")
            monkeypatch.setattr(eager_graphs, "ENABLED", False)
            want = run_all()
            monkeypatch.setattr(eager_graphs, "ENABLED", True)
            for r, (g, w) in enumerate(zip(got, want, strict=True)):
                assert torch.equal(g, w), f"T={num_tokens} {dtype} call {r}: replay != launches"
            ref = moe_reference(*rounds[-1], *flash.args(), 0, FLASH.swiglu_limit, 1.0)
            assert_moe_close(got[-1], ref, f"v4-flash T={num_tokens}, whole-call graph")


def test_eager_calls_of_large_size_allocate(flash):
    """Above ``_REUSE_MAX`` bytes of intermediates an eager call keeps nothing."""
    from nvfp4_ops.kernels import moe_cuda

    num_tokens = 1024
    plan = moe_cuda.dispatch.plan_moe(num_tokens, FLASH.top_k, FLASH.experts, FLASH.hidden,
                                      FLASH.intermediate, global_num_experts=FLASH.experts)
    assert plan.num_rows * (4 * FLASH.hidden + 2 * FLASH.intermediate) > moe_cuda._REUSE_MAX
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids, weights = random_routing(num_tokens, FLASH.experts, FLASH.top_k, device="cuda")
    nvfp4_ops.moe(hidden, ids, weights, *flash.args(), global_num_experts=FLASH.experts)
    assert not any(key[2] == plan.num_rows and key[4] == num_tokens * FLASH.top_k
                   for key in moe_cuda._reused)
