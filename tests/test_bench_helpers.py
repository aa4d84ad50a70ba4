"""CPU tests of the benchmark helpers in :mod:`nvfp4_ops.testing` (fast random experts, the
routing generators, expert-parallel slices, the MoE's byte / FLOP floor, the routing layouts
the peer MoE kernels read) and of the GPU-free paths of ``benchmarks/bench_moe.py``
(``--help``, ``--dry-run``, no CUDA, ``--fake-timings``), ``benchmarks/bench_overhead.py``
(argument errors, no CUDA) and ``benchmarks/dev/moe_tables.py`` (the README's MoE tables), run
as subprocesses (tests never import the benchmarks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nvfp4_ops import format as fmt
from nvfp4_ops.testing import (
    MXFP4_BYTES_PER_WEIGHT,
    NVFP4_BYTES_PER_WEIGHT,
    align_block_routing,
    cell_routing,
    contiguous_routing,
    ep_slice,
    expert_popularity,
    fast_random_experts,
    fast_random_mxfp4_experts,
    make_routing,
    moe_cost,
    skewed_routing,
    uniform_routing,
)

ROOT = Path(__file__).resolve().parents[1]


# --- routing generators ------------------------------------------------------------------

@pytest.mark.parametrize("generate", [uniform_routing, skewed_routing])
def test_routing_distinct_in_range_and_reproducible(generate):
    ids, weights = generate(300, 40, 6, seed=5)
    assert ids.shape == (300, 6) and ids.dtype == torch.int32
    assert int(ids.min()) >= 0 and int(ids.max()) < 40
    assert all(len(set(row.tolist())) == 6 for row in ids), "an expert repeated in a token"
    assert weights.dtype == torch.float32 and bool((weights > 0).all())
    torch.testing.assert_close(weights.sum(1), torch.ones(300))
    again = generate(300, 40, 6, seed=5)
    assert torch.equal(again[0], ids) and torch.equal(again[1], weights)
    assert not torch.equal(generate(300, 40, 6, seed=6)[0], ids)
    assert generate(3, 40, 6, seed=5, dtype=torch.int64)[0].dtype == torch.int64


def test_expert_popularity_is_zipf_over_a_permutation():
    probs = expert_popularity(50, 1.2, seed=3)
    assert probs.shape == (50,) and probs.dtype == torch.float64
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0, dtype=torch.float64))
    perm = probs.argsort(descending=True)
    ranked = probs[perm]
    want = torch.arange(1, 51, dtype=torch.float64) ** -1.2
    torch.testing.assert_close(ranked, want / want.sum())
    assert not torch.equal(perm, torch.arange(50)), "the popularity order is not permuted"
    assert torch.equal(expert_popularity(50, 1.2, seed=3), probs)
    assert not torch.equal(expert_popularity(50, 1.2, seed=4).argsort(), probs.argsort())
    torch.testing.assert_close(expert_popularity(8, 0.0), torch.full((8,), 1 / 8,
                                                                     dtype=torch.float64))


def test_skewed_routing_follows_the_popularity_order():
    """Counts per expert fall with popularity rank: the most popular expert is picked most,
    the top quarter of the ranks gets several times the slots of the bottom half."""
    num_experts, top_k = 64, 6
    ids, _ = skewed_routing(20000, num_experts, top_k, skew=1.2, seed=11)
    counts = torch.bincount(ids.reshape(-1).long(), minlength=num_experts).double()
    order = expert_popularity(num_experts, 1.2, seed=11).argsort(descending=True)
    by_rank = counts[order]
    assert int(by_rank.argmax()) == 0
    assert bool((by_rank[:4].diff() < 0).all()), by_rank[:4]
    assert by_rank[:16].mean() > 4 * by_rank[32:].mean()
    # top-k without replacement: the hottest expert appears at most once per token
    assert by_rank[0] <= 20000
    uniform_counts = torch.bincount(uniform_routing(20000, num_experts, top_k, seed=11)[0]
                                    .reshape(-1).long(), minlength=num_experts).double()
    assert uniform_counts.max() < 1.1 * uniform_counts.mean()


def test_make_routing_dispatches_and_refuses():
    assert torch.equal(make_routing("uniform", 7, 16, 6, seed=2)[0],
                       uniform_routing(7, 16, 6, seed=2)[0])
    assert torch.equal(make_routing("skew", 7, 16, 6, skew=0.8, seed=2)[0],
                       skewed_routing(7, 16, 6, skew=0.8, seed=2)[0])
    assert make_routing("skew", 0, 16, 6)[0].shape == (0, 6)
    with pytest.raises(ValueError, match="kind"):
        make_routing("zipf", 7, 16, 6)
    with pytest.raises(ValueError, match="top_k"):
        uniform_routing(7, 4, 6)
    with pytest.raises(ValueError, match="top_k"):
        skewed_routing(7, 4, 6)
    with pytest.raises(ValueError, match="skew"):
        expert_popularity(8, -1.0)


# --- expert-parallel slices and the roofline ----------------------------------------------

def test_cell_routing_is_one_seed_rule_per_cell():
    """``cell_routing``: ``make_routing`` with the benchmarks' per-cell seed, the same for
    every call of a cell, different between T and routings."""
    a = cell_routing("uniform", 8, 64, 6, seed=3)
    assert torch.equal(a[0], make_routing("uniform", 8, 64, 6, seed=3 * 100_003 + 16)[0])
    assert torch.equal(a[0], cell_routing("uniform", 8, 64, 6, seed=3)[0])
    b = cell_routing("skew", 8, 64, 6, seed=3)
    assert torch.equal(b[0], make_routing("skew", 8, 64, 6, seed=3 * 100_003 + 17)[0])
    assert not torch.equal(a[0], b[0])


def test_ep_slice():
    assert ep_slice(256, 1) == (0, 256)
    assert ep_slice(256, 8) == (128, 32)  # rank 4 of 8: in the middle
    assert ep_slice(384, 8) == (192, 48)
    assert ep_slice(384, 2, rank=1) == (192, 192)
    for bad in ((256, 3, None), (256, 0, None), (256, 8, 8), (256, 8, -1)):
        with pytest.raises(ValueError):
            ep_slice(*bad)


def test_moe_cost_counts_local_rows_and_touched_experts():
    ids = torch.tensor([[0, 1, 2], [2, 3, 9], [9, 8, 1]])
    hidden, inter = 128, 64
    cost = moe_cost(ids, hidden, inter, expert_start=1, local_experts=3)  # experts 1, 2, 3
    assert (cost.local_rows, cost.touched_experts) == (5, 3)
    assert cost.bytes == 3 * 3 * hidden * inter * NVFP4_BYTES_PER_WEIGHT
    assert cost.flops == 6.0 * 5 * hidden * inter
    assert cost.roofline_us == pytest.approx(cost.bytes / 4.1e12 * 1e6)  # memory bound
    allx = moe_cost(ids, hidden, inter, bytes_per_weight=MXFP4_BYTES_PER_WEIGHT,
                    hbm_tbps=1e9, peak_tflops=1.0)  # FLOP bound
    assert (allx.local_rows, allx.touched_experts) == (9, 6)
    assert allx.roofline_us == pytest.approx(allx.flops / 1e12 * 1e6)
    assert NVFP4_BYTES_PER_WEIGHT == 0.5625 and MXFP4_BYTES_PER_WEIGHT == 0.53125
    none = moe_cost(ids, hidden, inter, expert_start=4, local_experts=4)  # 4..7
    assert (none.local_rows, none.touched_experts, none.roofline_us) == (0, 0, 0.0)


def test_humming_tuning_subset_keeps_the_entry_for_one_row():
    from nvfp4_ops.testing import humming_tuning_subset

    full = [[0, 1, "a"], [1, 4, "b"], [4, 64, "c"], [64, 1024, "d"], [1024, 1 << 30, "e"]]
    # EP 1 at T = 1 and 512 (6 and 3072 routed rows): "a" only because the launcher asks m = 1
    assert [e[2] for e in humming_tuning_subset(full, [6, 3072])] == ["a", "c", "e"]
    # a count on a boundary keeps the entries on both sides of it
    assert [e[2] for e in humming_tuning_subset(full, [64])] == ["a", "c", "d"]
    assert [e[2] for e in humming_tuning_subset(full, [])] == ["a"]


# --- the routing layouts of vLLM's Humming paths ------------------------------------------

def _align_by_loops(ids, block, num_experts, start, local):
    """vLLM's ``moe_align_block_size`` (ignore_invalid_experts) written as plain loops."""
    flat = ids.reshape(-1).tolist()
    numel = len(flat)
    sorted_ids, expert_ids = [], []
    for e in range(local):
        slots = [s for s, x in enumerate(flat) if x - start == e]
        if not slots:
            continue
        padded = -(-len(slots) // block) * block
        sorted_ids += slots + [numel] * (padded - len(slots))
        expert_ids += [e] * (padded // block)
    return sorted_ids, expert_ids


@pytest.mark.parametrize("num_tokens,block,start,local", [
    (1, 8, 0, 16), (9, 4, 0, 16), (40, 16, 4, 8), (3, 8, 12, 4), (64, 1, 0, 16)])
def test_align_block_routing_matches_vllm_semantics(num_tokens, block, start, local):
    num_experts = 16
    ids, _ = skewed_routing(num_tokens, num_experts, 6, seed=num_tokens)
    sorted_ids, expert_ids, num_padded = align_block_routing(
        ids, block, num_experts=num_experts, expert_start=start, local_experts=local)
    want_sorted, want_experts = _align_by_loops(ids, block, num_experts, start, local)
    n = int(num_padded)
    numel = ids.numel()
    assert num_padded.dtype == sorted_ids.dtype == expert_ids.dtype == torch.int32
    assert n == len(want_sorted) and n % block == 0
    assert sorted_ids[:n].tolist() == want_sorted  # slot order within an expert: ascending
    assert bool((sorted_ids[n:] == numel).all()), "padding past the used length"
    max_padded = numel + num_experts * (block - 1)
    if numel < num_experts:
        max_padded = min(numel * block, max_padded)
    assert sorted_ids.numel() == max_padded  # vLLM's buffer size
    assert expert_ids.numel() == -(-max_padded // block)
    assert expert_ids[:n // block].tolist() == want_experts
    assert bool((expert_ids[n // block:] == -1).all())


def test_contiguous_routing_offsets_and_inverse():
    ids, _ = uniform_routing(50, 16, 6, seed=3)
    start, local = 4, 8
    offsets, inverse = contiguous_routing(ids, expert_start=start, local_experts=local)
    assert offsets.dtype == torch.int64 and offsets.shape == (local + 1,)
    assert inverse.dtype == torch.int32 and inverse.shape == ids.shape
    is_local = (ids >= start) & (ids < start + local)
    assert int(offsets[0]) == 0 and int(offsets[-1]) == int(is_local.sum())
    assert bool((inverse[~is_local] == -1).all())
    rows = inverse[is_local]
    assert sorted(rows.tolist()) == list(range(int(offsets[-1]))), "rows not a permutation"
    for (t, j) in is_local.nonzero().tolist():
        e = int(ids[t, j]) - start
        assert int(offsets[e]) <= int(inverse[t, j]) < int(offsets[e + 1])
    # stable: within an expert, rows follow the slot order
    flat = inverse.reshape(-1)
    for e in range(local):
        mine = [int(flat[s]) for s in range(flat.numel())
                if int(ids.reshape(-1)[s]) - start == e]
        assert mine == sorted(mine)
    off_all, inv_all = contiguous_routing(ids)
    assert int(off_all[-1]) == ids.numel() and bool((inv_all >= 0).all())


# --- fast random experts ------------------------------------------------------------------

def test_fast_random_experts_layout_and_ranges():
    e, h, i = 5, 64, 96
    q = fast_random_experts(e, h, i, seed=1)
    assert (q.w13.shape, q.w13.dtype) == ((e, 2 * i, h // 2), torch.uint8)
    assert (q.w13_scale.shape, q.w13_scale.dtype) == ((e, 2 * i, h // 16), torch.float8_e4m3fn)
    assert (q.w2.shape, q.w2_scale.shape) == ((e, h, i // 2), (e, h, i // 16))
    assert q.w13_global.shape == (e, 2) and q.w2_global.shape == (e,)
    for s in (q.w13_scale.float(), q.w2_scale.float()):
        assert float(s.min()) >= 0.25 and float(s.max()) <= 1.5
    assert float(q.w13_global.min()) >= 0.5 / (4 * h ** 0.5)
    assert float(q.w2_global.max()) < 1.5 / (4 * i ** 0.5)
    assert not torch.equal(q.w13_global[:, 0], q.w13_global[:, 1])
    shared = fast_random_experts(e, h, i, seed=1, shared_gate_up_global=True)
    assert torch.equal(shared.w13_global[:, 0], shared.w13_global[:, 1])
    assert torch.equal(shared.w13, q.w13) and torch.equal(shared.w2_global, q.w2_global)
    assert len(torch.unique(q.w13)) > 200, "codes are not random bytes"
    assert torch.isfinite(fmt.dequantize(q.w13[0], q.w13_scale[0], q.w13_global[0, 0])).all()
    with pytest.raises(ValueError, match="multiples of 32"):
        fast_random_experts(2, 48, 64)


def test_fast_random_experts_are_the_same_bytes_in_any_range():
    """A rank generating experts [3, 7) gets exactly those experts of the full set."""
    full = fast_random_experts(8, 64, 32, seed=7)
    part = fast_random_experts(4, 64, 32, seed=7, first_expert=3)
    for name in ("w13", "w13_scale", "w13_global", "w2", "w2_scale", "w2_global"):
        a, b = getattr(full, name)[3:7], getattr(part, name)
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    other = fast_random_experts(8, 64, 32, seed=8)
    assert not torch.equal(other.w13, full.w13)


def test_fast_random_mxfp4_experts():
    e, h, i = 4, 64, 96
    m = fast_random_mxfp4_experts(e, h, i, seed=2, first_expert=1)
    assert (m.w13_scale.shape, m.w13_scale.dtype) == ((e, 2 * i, h // 32), torch.uint8)
    assert m.w2_scale.shape == (e, h, i // 32)
    for s in (m.w13_scale, m.w2_scale):
        assert int(s.min()) == 117 and int(s.max()) == 122
    nv = fast_random_experts(e, h, i, seed=2, first_expert=1)
    assert torch.equal(m.w13, nv.w13) and torch.equal(m.w2, nv.w2), "codes differ from NVFP4"
    narrow = fast_random_mxfp4_experts(1, h, i, scale_bytes=(127, 127))
    assert bool((narrow.w2_scale == 127).all())
    with pytest.raises(ValueError, match="254"):
        fast_random_mxfp4_experts(1, h, i, scale_bytes=(120, 255))


# --- benchmarks/bench_moe.py without a GPU ---------------------------------------------------

def _bench(*args: str, tmp_path: Path | None = None,
           script: str = "bench_moe.py") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                   "")]))
    env["CUDA_VISIBLE_DEVICES"] = ""  # the no-GPU paths, also on a GPU machine
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path or ROOT)


def test_bench_overhead_arguments_without_cuda():
    bad = _bench("eager", "--processes", "0", script="bench_overhead.py")
    assert bad.returncode == 2 and "--processes must be >= 1, got 0" in bad.stderr
    out = _bench("eager", "--processes", "3", script="bench_overhead.py")
    assert out.returncode == 0, out.stderr
    assert "needs a CUDA GPU; nothing to measure here" in out.stdout


def test_bench_moe_help_and_plan():
    out = _bench("--help")
    assert out.returncode == 0, out.stderr
    for flag in ("--shapes", "--tokens", "--routing", "--ep", "--format", "--peers", "--reps",
                 "--check", "--ranks", "--dry-run", "--time-limit", "--chained", "--stages"):
        assert flag in out.stdout, flag
    out = _bench("--dry-run", "--shapes", "v4-pro", "--format", "nvfp4", "mxfp4",
                 "--ep", "8", "--routing", "skew", "--tokens", "1", "128")
    assert out.returncode == 0, out.stderr
    assert "1 shape(s) x 2 format(s) x 1 EP x 1 routing(s) x 2 T = 4 cells" in out.stdout
    assert "estimated time" in out.stdout
    bad = _bench("--dry-run", "--ep", "3")
    assert bad.returncode == 2 and "--ep 3" in bad.stderr


def test_bench_moe_without_cuda_measures_nothing():
    out = _bench("--shapes", "v4-flash", "--tokens", "8")
    assert out.returncode == 0, out.stderr
    assert "no CUDA device; nothing measured" in out.stdout
    ranks = _bench("--ranks", "2", "--shapes", "v4-flash")
    assert ranks.returncode == 0, ranks.stderr
    assert "needs 2 CUDA devices, found 0" in ranks.stdout


def test_bench_moe_fake_timings_write_every_row(tmp_path):
    """The reporting path on fake timings: one JSON per format and shape with every planned
    cell, real routing counts, derived ratios, the metadata; a table per shape / format /
    routing / EP; every file marked fake."""
    out = _bench("--fake-timings", "--shapes", "v4-flash", "--format", "nvfp4", "mxfp4",
                 "--tokens", "1", "512", "--chained", "2", "--out-dir", str(tmp_path),
                 tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    for f in ("nvfp4", "mxfp4"):
        doc = json.loads((tmp_path / f"bench_moe_{f}_v4-flash.json").read_text())
        assert doc["format"] == f and doc["shape"]["name"] == "v4-flash"
        meta = doc["meta"]
        assert meta["fake"] is True and "FAKE" in meta["gpu"]
        assert "--fake-timings" in meta["command"] and meta["versions"]["torch"]
        assert "commit" in meta and "source_fingerprint" in meta
        rows = doc["rows"]
        assert [(r["ep"], r["routing"], r["T"]) for r in rows] == [
            (ep, routing, t) for ep in (1, 8) for routing in ("skew", "uniform")
            for t in (1, 512)]
        for r in rows:
            assert r["local_experts"] == 256 // r["ep"]
            assert r["local_rows"] <= r["T"] * 6 and r["touched_experts"] <= r["local_experts"]
            assert r["speedup_vs_humming"] == pytest.approx(r["humming_us"] / r["ours_us"])
            assert r["speedup_vs_bf16"] == pytest.approx(r["bf16_us"] / r["ours_us"])
            assert r["ours_chained_us"] > 0
            assert r["ours_block_m"] in (8, 16, 32, 64, 128, 256)
            assert r["humming_gemm"] == ("indexed" if r["ep"] == 1 else "grouped_contiguous")
            if r["local_rows"]:
                assert r["ours_pct_roofline"] == pytest.approx(
                    100 * r["roofline_us"] / r["ours_us"])
            if f == "mxfp4":
                assert r["speedup_vs_ours_nvfp4"] == pytest.approx(
                    r["ours_nvfp4_us"] / r["ours_us"])
    ep1 = [r for r in json.loads((tmp_path / "bench_moe_nvfp4_v4-flash.json").read_text())[
        "rows"] if r["ep"] == 1 and r["T"] == 512 and r["routing"] == "uniform"][0]
    assert ep1["local_rows"] == 512 * 6 and ep1["touched_experts"] > 200
    assert out.stdout.count("[FAKE timings]") == 8  # 2 formats x 2 EP x 2 routings
    assert "== v4-flash | MXFP4 | uniform | EP 8: 32 local experts from 128 ==" in out.stdout
    assert ("wrote" in out.stdout and "png" in out.stdout) or "plots skipped" in out.stdout


def test_bench_moe_time_limit_lists_what_did_not_run(tmp_path):
    out = _bench("--fake-timings", "--shapes", "v4-flash", "--ep", "1", "--routing", "uniform",
                 "--tokens", "1", "8", "--time-limit", "1e-9", "--out-dir", str(tmp_path),
                 tmp_path=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "bench_moe_nvfp4_v4-flash.json").read_text())
    assert doc["rows"] == []
    assert len(doc["notes"]) == 2 and all("not run (--time-limit" in n for n in doc["notes"])


def test_readme_moe_tables_are_the_committed_results():
    """The README's MoE tables are what ``benchmarks/dev/moe_tables.py`` renders from the
    committed ``bench_moe`` JSON (run as a subprocess), so they cannot drift from the data."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/dev/moe_tables.py"), "--dir",
                          str(ROOT / "benchmarks/results")], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    readme = (ROOT / "README.md").read_text()
    tables = [t for t in out.split("\n\n") if t.startswith("| V4-")]
    assert len(tables) == 2
    for table in tables:
        assert table.strip() in readme, table.splitlines()[0]
    assert "ahead of Humming in" in out


def test_results_readme_moe_tables_are_the_committed_results():
    """The results README's per-shape MoE tables are ``moe_tables.py --detail`` of the same
    JSON."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/dev/moe_tables.py"), "--dir",
                          str(ROOT / "benchmarks/results"), "--detail"], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    readme = (ROOT / "benchmarks/results/README.md").read_text()
    tables = [t.split("\n", 1)[1] for t in out.split("\n\n") if t.startswith("v4-")]
    assert len(tables) == 2
    for table in tables:
        assert "| EP 8, skew: tile |" in table
        assert table.strip() in readme, table.splitlines()[2]


def test_moe_tables_say_what_the_lead_would_take(tmp_path):
    """``moe_tables.py``'s summary gives, for each cell short of 1.2x Humming, the share of
    its roofline that 1.2x Humming's time would reach; cells at 1.2x or more are not listed."""
    def row(t, ours, humming, roof):
        return {"ep": 1, "routing": "uniform", "T": t, "ours_us": ours, "humming_us": humming,
                "roofline_us": roof, "speedup_vs_humming": humming / ours,
                "ours_pct_roofline": 100 * roof / ours,
                "humming_pct_roofline": 100 * roof / humming}
    rows = [row(8, 90.0, 100.0, 50.0), row(32, 50.0, 100.0, 40.0)]
    (tmp_path / "bench_moe_nvfp4_v4-pro.json").write_text(json.dumps({"rows": rows}))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/dev/moe_tables.py"), "--dir",
                          str(tmp_path), "--shapes", "v4-pro"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert "1.2x Humming, where not met (1 cells)" in out
    # 1.2 * 50 / 100 = 60 % of the roofline; ours 50 / 90 = 56 %, Humming 50 %
    assert "EP 1 uniform T = 8: 60 % (56, 50)" in out
    assert "T = 32:" not in out.split("where not met")[1]


def test_with_config_fields_sets_only_matching_gemms():
    """``with_config_fields``: the fields go on every GEMM of a MoE plan whose config has them
    (the hot tile's included), or only on those whose config has the ``where`` values; the
    others and the plan itself stay as they are; values take the field's type."""
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.shapes import get_shape
    from nvfp4_ops.testing import with_config_fields

    s = get_shape("v4-flash")
    plan = dispatch.plan_moe(2048, s.top_k, s.experts, s.hidden, s.intermediate,
                             order=dispatch.WeightOrder.WPERM, flex=True)
    assert plan.hot is not None

    def gemms(p):
        return [p.gate_up, p.down, p.hot.gate_up, p.hot.down]

    # both forms set explicitly (the dispatch unrolls some of these GEMMs itself)
    rolled = with_config_fields(plan, {"unroll": False})
    every = with_config_fields(rolled, {"unroll": True})
    assert all(g.config.unroll for g in gemms(every))
    assert not any(g.config.unroll for g in gemms(rolled))
    some = with_config_fields(plan, {"stages": 6}, {"block_m": 64, "row_wgs": 2})
    changed = [g.config != h.config for g, h in zip(gemms(some), gemms(plan), strict=True)]
    assert changed == [g.config.block_m == 64 and g.config.row_wgs == 2 for g in gemms(plan)]
    assert any(changed) and not all(changed)
    decode = dispatch.plan_moe(1, s.top_k, s.experts, s.hidden, s.intermediate)
    assert decode.gate_up.family != "wgmma"
    assert with_config_fields(decode, {"unroll": True}) == decode  # no such streamed field
    gate_up_only = with_config_fields(decode, {"stages": 4}, {"epilogue": "swiglu"})
    assert gate_up_only.gate_up.config.stages == 4 != decode.gate_up.config.stages
    assert gate_up_only.down == decode.down
    assert type(with_config_fields(rolled, {"unroll": 1}).down.config.unroll) is bool
