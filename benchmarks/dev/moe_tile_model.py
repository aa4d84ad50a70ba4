"""What one token tile per MoE call leaves on the table, by the tile cost model (no GPU).

The MoE's time is close to (real token tiles) x (the cost of one tile)
(``dispatch.MOE_TILE_COST``, measured by ``moe_tiles.py``). For routings drawn like the
benchmark's (``testing.make_routing``), this prints that cost, in 8-row-tile units, for the
policy's single tile (``dispatch.moe_block_m``), the best single tile for the real counts, a
tile per expert (each expert in its own cheapest tile) and the best two tile classes (each
expert in the cheaper of a small and a large tile), with the gain of the last two over the
policy.

    python benchmarks/dev/moe_tile_model.py [--shapes v4-flash v4-pro] [--seed 1]

``--grid``: instead, the CTAs each GEMM of the op's plan launches (its static grid: every token
tile the padded rows can hold) against those with a real token tile, for EP 1 and one EP 8
rank (uniform routing): the work a persistent grouped GEMM would not launch.

    python benchmarks/dev/moe_tile_model.py --grid [--tokens 128 512 2048 4096]

``--fit LOG``: refit ``dispatch.MOE_TILE_COST`` to a ``moe_tiles.py`` log (its per-cell lines:
the whole op's µs at each tile). The routings are redrawn as ``moe_tiles.py`` draws them (seed
1), so each cell's per-expert counts are known; the model is ``unit(shape) x sum_e
expert_cost(rows_e, tile)`` (partial tiles at their flexible width where the tile has one,
``--whole`` for logs timed with whole tiles), fitted in log space. Printed: the fitted costs
beside the current ones, each cell's measured best tile, the tile the policy would take with
either table and what that tile measured.

    python benchmarks/dev/moe_tile_model.py --fit benchmarks/results/moe_tiles_h200.log --whole
"""

from __future__ import annotations

import argparse
import itertools
import re

import torch


def cost_of(counts: list[int], tiles_of: dict[int, int] | int) -> float:
    """Tile units of the experts' ``counts`` when each takes the cheapest of the tiles it may
    use: one ``block_m`` for all (an int), or any of a tuple of tiles."""
    from nvfp4_ops.kernels.dispatch import MOE_TILE_COST

    options = (tiles_of,) if isinstance(tiles_of, int) else tiles_of
    return sum(min(-(-c // bm) * MOE_TILE_COST[bm] for bm in options) for c in counts)


def main(argv: list[str] | None = None) -> int:
    import nvfp4_ops
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.testing import make_routing

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["v4-flash", "v4-pro"])
    p.add_argument("--tokens", nargs="+", type=int, default=[128, 512, 1024, 2048, 4096, 16384])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--grid", action="store_true",
                   help="real and empty CTAs of the op's static grids, EP 1 and 8")
    p.add_argument("--fit", metavar="LOG", help="refit MOE_TILE_COST to a moe_tiles.py log")
    p.add_argument("--whole", action="store_true",
                   help="(--fit) the log's tiles ran whole, not flexible, widths")
    args = p.parse_args(argv)
    if args.grid:
        return grid_report(args)
    if args.fit:
        return fit_report(args)
    tiles = dispatch.BLOCK_MS
    print(f"{'shape':9s} {'T':>6s} {'routing':8s} {'policy':>12s} {'best single':>14s} "
          f"{'per expert':>16s} {'two classes':>22s}")
    for name in args.shapes:
        s = nvfp4_ops.get_shape(name)
        for num_tokens in args.tokens:
            for routing in ("uniform", "skew"):
                ids, _ = make_routing(routing, num_tokens, s.experts, s.top_k, seed=args.seed)
                counts = torch.bincount(ids.reshape(-1).long(), minlength=s.experts).tolist()
                policy = dispatch.moe_block_m(num_tokens * s.top_k, s.experts)
                at_policy = cost_of(counts, policy)
                single = min(tiles, key=lambda bm: cost_of(counts, bm))
                per_expert = cost_of(counts, tiles)
                pair = min(itertools.combinations(tiles, 2), key=lambda p: cost_of(counts, p))
                two = cost_of(counts, pair)
                print(f"{name:9s} {num_tokens:6d} {routing:8s} {policy:3d} {at_policy:8.0f} "
                      f"{single:3d} {cost_of(counts, single):10.0f} "
                      f"{per_expert:8.0f} ({at_policy / per_expert:4.2f}x) "
                      f"{pair[0]:3d}/{pair[1]:<3d} {two:8.0f} ({at_policy / two:4.2f}x)")
    return 0


#: a moe_tiles.py cell line: shape, EP, T, routing, then ``tile[f][*] µs[tiles]`` per tile
_CELL = re.compile(r"^(\S+) ep(\d+) T=(\d+)\s+(\S+)\s.*?roof\s+[\d.]+\s+(.*?)\s+best")
_TILE = re.compile(r"(\d+)(f?)\*?\s+([\d.]+)\[\d+\]")


def parse_tiles_log(text: str) -> list[tuple[str, int, int, str, dict[int, float]]]:
    """``(shape, ep, T, routing, {tile: µs})`` per cell line of a ``moe_tiles.py`` log (with
    ``--flex 0 1`` only the flexible timings: ``64f``)."""
    cells = []
    for line in text.splitlines():
        m = _CELL.match(line)
        if not m:
            continue
        times = {}
        entries = _TILE.findall(m.group(5))
        flexed = any(f for _, f, _ in entries)
        for tile, f, us in entries:
            if f or not flexed or int(tile) not in (64, 128, 256):
                times[int(tile)] = float(us)
        cells.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4), times))
    return cells


def _model_units(counts: list[int], block_m: int, costs: dict[int, float], flex: bool) -> float:
    """``sum_e expert_cost(rows_e, block_m)`` under the whole cost table ``costs`` (the
    dispatch's own pricing of flexible partial tiles where ``flex``)."""
    from nvfp4_ops.kernels import dispatch

    gran = dispatch.moe_priced_granularity(block_m) if flex else 0
    return sum(dispatch.expert_cost(c, block_m, gran, costs) for c in counts if c)


def fit_report(args) -> int:
    """``--fit``: least squares in log space over every (cell, tile) of the log, by coordinate
    search on each tile's cost (8 fixed at 1) with the per-shape unit solved in closed form."""
    import math

    import nvfp4_ops
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.testing import ep_slice, make_routing

    with open(args.fit) as f:
        cells = parse_tiles_log(f.read())
    if not cells:
        print(f"no cell lines in {args.fit}")
        return 1
    flex = not args.whole
    data = []  # (shape, counts, slots, local, global, {tile: µs})
    for name, ep, num_tokens, routing, times in cells:
        s = nvfp4_ops.get_shape(name)
        start, local = ep_slice(s.experts, ep)
        ids, _ = make_routing(routing, num_tokens, s.experts, s.top_k, seed=1)
        flat = ids.reshape(-1).long() - start
        counts = torch.bincount(flat[(flat >= 0) & (flat < local)], minlength=local).tolist()
        data.append((name, counts, num_tokens * s.top_k, local, s.experts, times))

    current = dict(dispatch.MOE_TILE_COST)

    def loss(changed):
        costs = {**current, **changed}
        resid = {}
        for name, counts, _, _, _, times in data:
            for bm, us in times.items():
                resid.setdefault(name, []).append(
                    math.log(us) - math.log(_model_units(counts, bm, costs, flex)))
        # the per-shape unit in closed form: the mean log residual
        return sum(sum((r - sum(rs) / len(rs)) ** 2 for r in rs) for rs in resid.values())

    tiles = sorted({bm for *_, times in data for bm in times} - {8})
    costs = {bm: current[bm] for bm in tiles}
    best = loss(costs)
    for step in (0.2, 0.05, 0.01):
        improved = True
        while improved:
            improved = False
            for bm in tiles:
                for sign in (1, -1):
                    trial = {**costs, bm: round(costs[bm] * (1 + sign * step), 3)}
                    value = loss(trial)
                    if value < best - 1e-12:
                        costs, best, improved = trial, value, True
    print("tile   current  fitted")
    for bm in tiles:
        print(f"{bm:4d}   {current[bm]:7.3f}  {costs[bm]:6.3f}")
    print(f"log-space residual {best:.4f} (current table {loss({}):.4f})\n")
    print(f"{'shape':9s} {'T':>6s} {'cell':18s} {'best':>5s} {'cur':>5s} {'fit':>5s} "
          f"{'cur/best':>8s} {'fit/best':>8s}")
    for (name, ep, num_tokens, routing, times), (_, _, slots, local, glob, _) in zip(
            cells, data, strict=True):
        best_tile = min(times, key=times.get)
        picks = [dispatch.moe_block_m(dispatch.local_slots(slots, local, glob), local, flex,
                                      table) for table in (current, {**current, **costs})]
        ratio = [f"{times[t] / times[best_tile]:8.2f}" if t in times else "       -"
                 for t in picks]
        print(f"{name:9s} {num_tokens:6d} ep{ep} {routing:13s} {best_tile:5d} {picks[0]:5d} "
              f"{picks[1]:5d} {ratio[0]} {ratio[1]}")
    return 0


def grid_report(args) -> int:
    """Per shape, EP slice and T: each GEMM's launched CTAs (its static grid) and how many of
    them have a real token tile under uniform routing (``testing.make_routing``)."""
    import nvfp4_ops
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.kernels.triton.moe_routing import padded_rows
    from nvfp4_ops.testing import ep_slice, make_routing

    print(f"{'shape':9s} {'ep':>2s} {'T':>6s} {'tile':>8s} {'gemm':8s} {'CTAs':>7s} "
          f"{'real':>7s} {'empty':>7s}")
    for name in args.shapes:
        s = nvfp4_ops.get_shape(name)
        for ep in (1, 8):
            start, local = ep_slice(s.experts, ep)
            for num_tokens in args.tokens:
                ids, _ = make_routing("uniform", num_tokens, s.experts, s.top_k, seed=args.seed)
                flat = ids.reshape(-1).long() - start
                counts = torch.bincount(flat[(flat >= 0) & (flat < local)],
                                        minlength=local).tolist()
                plan = dispatch.plan_moe(num_tokens, s.top_k, local, s.hidden, s.intermediate,
                                         global_num_experts=s.experts,
                                         order=dispatch.WeightOrder.WPERM)
                hot = plan.hot.routing if plan.hot is not None else None
                # each class's grid covers its own rows (moe_cuda): the base class the
                # one-tile bound, the hot class the rows above it
                base_rows = padded_rows(num_tokens * s.top_k, local, plan.block_m, None)
                classes = [("", plan.block_m, (plan.gate_up, plan.down),
                            base_rows // plan.block_m,
                            [c for c in counts if not _takes_hot(c, plan.block_m, hot)])]
                if hot is not None:
                    classes.append(("hot", hot.block_m, (plan.hot.gate_up, plan.hot.down),
                                    (plan.num_rows - base_rows) // hot.block_m,
                                    [c for c in counts if _takes_hot(c, plan.block_m, hot)]))
                for tag, bm, gemms, tiles, mine in classes:
                    real_tiles = sum(-(-c // bm) for c in mine)
                    for label, gemm in zip(("gate/up", "down"), gemms, strict=True):
                        cfg = gemm.config
                        blocks = cfg.n_out // (getattr(cfg, "features_per_cta", 0)
                                               or cfg.rows_out)
                        ctas = tiles * blocks
                        if getattr(cfg, "ctas", 0):  # persistent: a capped grid
                            ctas = min(ctas, cfg.ctas)
                        real = real_tiles * blocks
                        print(f"{name:9s} {ep:2d} {num_tokens:6d} {bm:4d} {tag:3s} {label:8s} "
                              f"{ctas:7d} {real:7d} {max(0, ctas - real):7d}")
    return 0


def _takes_hot(count: int, block_m: int, hot) -> bool:
    """Whether an expert with ``count`` rows takes the hot tile (the routing's rule,
    ``moe_routing``, "Hot experts")."""
    return hot is not None and count >= hot.min_rows and (
        -(-count // hot.block_m) * hot.cost < -(-count // block_m) * hot.base_cost)


if __name__ == "__main__":
    raise SystemExit(main())
