"""What one token tile per MoE call leaves on the table, by the tile cost model (no GPU).

The MoE's time is close to (real token tiles) x (the cost of one tile)
(``dispatch.MOE_TILE_COST``, measured by ``moe_tiles.py``). For routings drawn like the
benchmark's (``testing.make_routing``), this prints that cost, in 8-row-tile units, for the
policy's single tile (``dispatch.moe_block_m``), the best single tile for the real counts, a
tile per expert (each expert in its own cheapest tile) and the best two tile classes (each
expert in the cheaper of a small and a large tile), with the gain of the last two over the
policy.

    python benchmarks/dev/moe_tile_model.py [--shapes v4-flash v4-pro] [--seed 1]
"""

from __future__ import annotations

import argparse
import itertools

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
    args = p.parse_args(argv)
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


if __name__ == "__main__":
    raise SystemExit(main())
