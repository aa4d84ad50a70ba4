"""The MoE's token tile, measured: every tile the grouped GEMMs cover, per cell (CUDA only).

For each shape, T, routing and EP slice, times the whole op (routing, gather, both GEMMs,
combine; ``moe_cuda.moe_forward``) at every ``block_m`` the dispatch could choose
(``dispatch.plan_moe(block_m=...)``), one call per CUDA-graph replay with a read flush, and
prints the µs per tile (one tile for all experts, ``hot=False``) next to the tile the policy
picks (``*``), the tiles the routing really needs (``sum_e ceil(rows_e / block_m)``) and, where
the policy adds a hot tile, the op's own plan. Tiles not precompiled are compiled first
(slow): run ``python -m nvfp4_ops precompile --shape v4-flash --shape v4-pro`` before.

``--variants``: at each tile, also time the whole op with one GEMM's tile shape changed (the
other GEMM as planned), to find the grouped tile shape per token tile; these compile first.
WGMMA tiles (16-256): ``row_wgs`` in ``--row-wgs``, ring ``stages`` in ``--stages``
(``dispatch._wgmma_fields``); the streamed 8-row tile: consumer warps ``warps_k`` in
``--stream-warps``, ring ``stages`` in ``--stream-stages`` (persistent CTAs kept as planned).
``--hot-min``: time the op's plan with a hot tile at each of these min rows too (0: as
planned), the hot class's floor (``dispatch.moe_hot_class``). ``--flex 0 1``: time each tile
with whole-width and flexible-width CTAs (``dispatch.plan_moe(flex=...)``), and the op's own
plan both ways (``op flex`` / ``op whole``: the A/B of ``WgmmaConfig.flex``).
``--op-fields``: time the op's plan with config fields set (on every GEMM whose config has
them, or only those also matching ``@KEY=V``), between two runs of the plan itself, outputs
checked bitwise, e.g. ``--op-fields unroll=1 "unroll=1;stages=6@block_m=64,row_wgs=2"
stages=3@epilogue=swiglu``. ``--format mxfp4``: MXFP4 experts (the kernels' UE8M0
scales and global scales as :func:`nvfp4_ops.prepare_mxfp4_moe` makes them) instead of NVFP4;
with ``--mx-other-globals`` the op's plan is also timed with the same global scales in the
other form (one per row <-> one per expert half), outputs checked bitwise. ``--trim``: the
op's plan also with ``P`` cut to the rows the cell's routing really needs, so no grid has an
empty token tile (only this routing fits it: a measurement, not a plan): what the static
grids' empty CTAs cost, the most a persistent or capped walk could win back.

    python benchmarks/dev/moe_tiles.py --shapes v4-pro --tokens 256 512 1024 \
        --routing uniform skew --ep 1 8
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _timing import l2_flush, time_one_call  # noqa: E402


def with_hot_min(plan, num_slots: int, num_experts: int, min_rows: int):
    """``plan`` with its hot class's ``min_rows`` replaced (0: as planned) and the padded rows
    recomputed for it."""
    from nvfp4_ops.kernels.triton.moe_routing import padded_rows

    if not min_rows:
        return plan
    hot = plan.hot.routing._replace(min_rows=min_rows)
    return dataclasses.replace(plan, hot=dataclasses.replace(plan.hot, routing=hot),
                               num_rows=padded_rows(num_slots, num_experts, plan.block_m, hot))


def shape_label(config) -> str:
    """A GEMM config's tile shape in a few characters: WGMMA ``r{row_wgs}st{stages}``,
    streamed ``wk{warps_k}st{stages}`` plus ``p{ctas}`` when persistent."""
    if hasattr(config, "row_wgs"):
        return f"r{config.row_wgs}st{config.num_stages}"
    return f"wk{config.warps_k}st{config.stages}{f'p{config.ctas}' if config.ctas else ''}"


def variant_plans(plan, args):
    """``(gemm, label, plan)`` for each variant of ``plan`` with one GEMM's tile shape
    replaced (WGMMA: ``row_wgs`` x ``stages``; streamed: ``warps_k`` x ``stages``, from
    ``args``); the planned shape itself is left out, and shapes a config refuses."""
    out = []
    if plan.gate_up.family == plan.down.family == "wgmma":
        for row_wgs in args.row_wgs:  # both GEMMs at one row_wgs, rings as planned
            try:
                pair = [dataclasses.replace(getattr(plan, w).config, row_wgs=row_wgs)
                        for w in ("gate_up", "down")]
            except ValueError:
                continue
            if pair[0].name == plan.gate_up.config.name:
                continue
            out.append(("both", f"r{row_wgs}", dataclasses.replace(
                plan, gate_up=dataclasses.replace(plan.gate_up, config=pair[0]),
                down=dataclasses.replace(plan.down, config=pair[1]))))
    for which in ("gate_up", "down"):
        gemm = getattr(plan, which)
        if gemm.family == "wgmma":
            shapes = [dict(row_wgs=r, stages=st) for r in args.row_wgs for st in args.stages]
        elif gemm.family == "stream":
            shapes = [dict(warps_k=wk, stages=st) for wk in args.stream_warps
                      for st in args.stream_stages]
        else:
            continue
        for shape in shapes:
            try:
                config = dataclasses.replace(gemm.config, **shape)
            except ValueError:
                continue
            seen = [getattr(v, which).config.name for w, _, v in out if w == which]
            if config.name in (gemm.config.name, *seen):
                continue
            out.append((which, shape_label(config), dataclasses.replace(
                plan, **{which: dataclasses.replace(gemm, config=config)})))
    return out


def experts(num_experts: int, hidden: int, inter: int, mx: bool) -> list[torch.Tensor]:
    """Random experts on the GPU as ``moe_forward`` takes them (``w13, w13_scale, w13_global,
    w2, w2_scale, w2_global``), prepared as the glue prepares a layer's (codes in the ``wperm``
    order): NVFP4 (:func:`nvfp4_ops.prepare_moe`), or (``mx``) MXFP4 with the scales in the
    kernels' UE8M0 form and one global scale per expert half
    (:func:`nvfp4_ops.prepare_mxfp4_moe`)."""
    import nvfp4_ops
    from nvfp4_ops.testing import fast_random_experts, fast_random_mxfp4_experts

    if mx:
        m = fast_random_mxfp4_experts(num_experts, hidden, inter, device="cuda")
        s13, g13, s2, g2, _ = nvfp4_ops.prepare_mxfp4_moe(m.w13, m.w13_scale, m.w2,
                                                          m.w2_scale, wperm=True, native=True)
        return [m.w13, s13, g13, m.w2, s2, g2]
    tensors = list(fast_random_experts(num_experts, hidden, inter, device="cuda").args())
    nvfp4_ops.prepare_moe(*tensors, wperm=True)
    return tensors


def other_globals(w: list[torch.Tensor]) -> tuple[str, list[torch.Tensor]]:
    """``w`` (as :func:`experts` returns it, MXFP4) with its global scales in the other form,
    the same values: one per row (``w13_global [E, 2I]``, ``w2_global [E, H]``) if they are
    one per expert half, else one per expert half (refused when rows differ). Returns the
    form's name and the tensors."""
    w13, s13, g13, w2, s2, g2 = w
    inter, hidden = w13.shape[1] // 2, w2.shape[1]
    if g13.shape[-1] == 2 and g2.dim() == 1:  # per half -> per row
        rows13 = g13.unsqueeze(-1).expand(-1, 2, inter).reshape(-1, 2 * inter).contiguous()
        return "row", [w13, s13, rows13, w2, s2, g2.unsqueeze(-1).expand(-1, hidden).contiguous()]
    halves = g13.reshape(g13.shape[0], 2, -1)
    if not (bool((halves == halves[:, :, :1]).all()) and bool((g2 == g2[:, :1]).all())):
        raise SystemExit("--mx-other-globals: the experts' rows have different global scales")
    return "half", [w13, s13, halves[:, :, 0].contiguous(), w2, s2, g2[:, 0].contiguous()]


def with_fields(plan, groups: list[tuple[dict, dict]]):
    """``plan`` with each group's ``(fields, where)`` applied in order
    (:func:`nvfp4_ops.testing.with_config_fields`)."""
    from nvfp4_ops.testing import with_config_fields

    for fields, where in groups:
        plan = with_config_fields(plan, fields, where)
    return plan


def fielded(plan, groups: list[tuple[dict, dict]]):
    """:func:`with_fields`, or None where a config refuses the fields (``ValueError``: a
    chunk that does not divide K, a ring too large for shared memory, ...)."""
    try:
        return with_fields(plan, groups)
    except ValueError:
        return None


def parse_fields(items: list[str]) -> list[list[tuple[dict, dict]]]:
    """One variant per item, ``GROUP[;GROUP]``, a group ``FIELD=V[,FIELD=V][@KEY=V[,KEY=V]]``
    (ints where they parse as ints, else strings): set the fields on the GEMMs whose config
    has them and every ``KEY=V`` (:func:`nvfp4_ops.testing.with_config_fields`).
    ``"unroll=1;stages=6@block_m=64,row_wgs=2"`` -> ``[[({"unroll": 1}, {}), ({"stages": 6},
    {"block_m": 64, "row_wgs": 2})]]``; ``"stages=3@epilogue=swiglu"`` -> ``[[({"stages": 3},
    {"epilogue": "swiglu"})]]``."""
    def value(v: str):
        return int(v) if v.lstrip("-").isdigit() else v

    def pairs(text: str) -> dict:
        return {k: value(v) for k, v in (kv.split("=", 1) for kv in text.split(",") if kv)}

    return [[(pairs(group.partition("@")[0]), pairs(group.partition("@")[2]))
             for group in item.split(";")] for item in items]


def time_against_plan(call, expected, plan_us: float, reps: int, flush, vcall,
                      label: str) -> None:
    """Print the µs of ``vcall`` (an op call equal to ``call``'s, checked bitwise against
    ``expected``) timed between the plan's first run (``plan_us``) and a second one."""
    diff = int((vcall() != expected).sum())
    v_us = time_one_call(vcall, reps, flush)
    again = time_one_call(call, reps, flush)
    print(f"    op {label}: {v_us:8.1f} us, plan again {again:8.1f} "
          f"({v_us / (0.5 * (plan_us + again)):.3f}){f' DIFF {diff}' if diff else ''}",
          flush=True)


def time_variants(plan, call, base_us: float, args, flush) -> None:
    """Time the whole op at each :func:`variant_plans` of ``plan`` and print the µs of each
    against the planned shapes' ``base_us`` (and ``DIFF n`` where its output is not bitwise
    the planned one's)."""
    lines: dict[str, list[str]] = {}
    expected = call()
    for which, label, variant in variant_plans(plan, args):
        fn = functools.partial(call.func, *call.args, **{**call.keywords, "plan": variant})
        try:
            # the tile shape changes no output element's summation order: bitwise equal
            diff = int((fn() != expected).sum())
            us = time_one_call(fn, args.reps, flush)
            lines.setdefault(which, []).append(
                f"{label} {us:8.1f} ({us / base_us:4.2f}){f' DIFF {diff}' if diff else ''}")
        except Exception as exc:  # noqa: BLE001 - report and go on
            lines.setdefault(which, []).append(f"{label}: {type(exc).__name__}")
    for which, line in lines.items():
        gemm = getattr(plan, "gate_up" if which == "both" else which).config
        print(f"    bm {plan.block_m} {which} planned {shape_label(gemm)} "
              f"{base_us:8.1f}: " + "  ".join(line), flush=True)


def main(argv: list[str] | None = None) -> int:
    import nvfp4_ops
    from nvfp4_ops.kernels import dispatch, moe_cuda
    from nvfp4_ops.testing import ep_slice, make_routing, moe_cost

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["v4-flash", "v4-pro"])
    p.add_argument("--tokens", nargs="+", type=int, default=[128, 256, 512, 1024, 2048, 4096])
    p.add_argument("--routing", nargs="+", default=["uniform", "skew"])
    p.add_argument("--ep", nargs="+", type=int, default=[1])
    p.add_argument("--tiles", nargs="+", type=int, default=list(dispatch.BLOCK_MS))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seeds", nargs="+", type=int, default=[1],
                   help="routing draws per cell (one EP rank's local rows differ by draw)")
    p.add_argument("--variants", action="store_true",
                   help="also time each GEMM's tile shapes (WGMMA: --row-wgs x --stages; "
                        "streamed: --stream-warps x --stream-stages)")
    p.add_argument("--row-wgs", nargs="+", type=int, default=[1, 2])
    p.add_argument("--stages", nargs="+", type=int, default=[0, 3, 4, 6])
    p.add_argument("--stream-warps", nargs="+", type=int, default=[2, 4],
                   help="--variants of the streamed 8-row tile: consumer warps")
    p.add_argument("--stream-stages", nargs="+", type=int, default=[2, 3, 4, 6],
                   help="--variants of the streamed 8-row tile: ring stages")
    p.add_argument("--hot-min", nargs="+", type=int, default=[0],
                   help="where the policy adds a hot tile, time it at each of these min rows "
                        "(0: the policy's)")
    p.add_argument("--flex", nargs="+", type=int, default=[1], choices=[0, 1],
                   help="time each tile with whole-width (0) and flexible-width (1) CTAs")
    p.add_argument("--op-fields", nargs="+", default=[],
                   metavar="FIELD=V[,FIELD=V][@KEY=V,..][;...]",
                   help="also time the op's own plan with these config fields set on every "
                        "GEMM whose config has them, or after @ only on those whose config "
                        "also has those values; groups separated by ; (one variant per "
                        "argument; outputs checked bitwise)")
    p.add_argument("--format", choices=("nvfp4", "mxfp4"), default="nvfp4",
                   help="the experts' format: NVFP4, or MXFP4 with its UE8M0 scales in the "
                        "kernels' form, prepared as the glue prepares them "
                        "(nvfp4_ops.prepare_mxfp4_moe)")
    p.add_argument("--mx-other-globals", action="store_true",
                   help="MXFP4: also time the op's plan with the global scales in the other "
                        "form (per row <-> per expert half, the same values)")
    p.add_argument("--jobs", type=int, default=1,
                   help="compile the configs the run needs in this many processes first")
    p.add_argument("--trim", action="store_true",
                   help="also time the op's plan (without a hot tile) with P cut to the rows "
                        "this routing really needs: no empty token tiles in any grid (a bound "
                        "only this routing meets, so not a plan): what the static grid's "
                        "empty CTAs cost, the most a persistent or capped walk could win")
    p.add_argument("--time-limit", type=float, default=0.0, help="stop after S seconds")
    args = p.parse_args(argv)
    mx = args.format == "mxfp4"
    if args.jobs > 1:
        from nvfp4_ops.cli.precompile import compile_configs

        configs = []
        for shape_name in args.shapes:
            s = nvfp4_ops.get_shape(shape_name)
            for ep in args.ep:
                local = ep_slice(s.experts, ep)[1]
                for num_tokens in args.tokens:
                    for fx in args.flex:
                        op = dispatch.plan_moe(num_tokens, s.top_k, local, s.hidden,
                                               s.intermediate, global_num_experts=s.experts,
                                               order=dispatch.WeightOrder.WPERM, mx=mx,
                                               flex=bool(fx))
                        for o in [op, *(fielded(op, f) for f in parse_fields(args.op_fields))]:
                            if o is None:
                                continue
                            configs += [c.config for c in (o.gate_up, o.down)]
                            if o.hot is not None:
                                configs += [o.hot.gate_up.config, o.hot.down.config]
                    for bm, fx in [(bm, fx) for bm in args.tiles for fx in args.flex]:
                        try:
                            plan = dispatch.plan_moe(num_tokens, s.top_k, local, s.hidden,
                                                     s.intermediate, global_num_experts=s.experts,
                                                     block_m=bm, order=dispatch.WeightOrder.WPERM,
                                                     mx=mx, hot=False, flex=bool(fx))
                        except ValueError:
                            continue
                        if plan is None or plan.block_m != bm:
                            continue
                        configs += [plan.gate_up.config, plan.down.config]
                        if args.variants:
                            configs += [c for _, _, v in variant_plans(plan, args)
                                        for c in (v.gate_up.config, v.down.config)]
        t0 = time.monotonic()
        n = compile_configs(configs, args.jobs)
        print(f"{n} variants compiled in {time.monotonic() - t0:.0f} s", flush=True)
    flush = l2_flush("read")
    t_start = time.monotonic()
    rows = []
    for shape_name in args.shapes:
        s = nvfp4_ops.get_shape(shape_name)
        h, i, e, k = s.hidden, s.intermediate, s.experts, s.top_k
        full = experts(e, h, i, mx)
        for ep in args.ep:
            start, local = ep_slice(e, ep)
            w = [t[start:start + local] for t in full]
            form, w_other = other_globals(w) if mx and args.mx_other_globals else (None, None)
            for num_tokens in args.tokens:
                for routing, seed in [(r, sd) for r in args.routing for sd in args.seeds]:
                    label = routing if args.seeds == [1] else f"{routing}/{seed}"
                    if args.time_limit and time.monotonic() - t_start > args.time_limit:
                        print("time limit reached")
                        break
                    ids, weights = make_routing(routing, num_tokens, e, k, seed=seed)
                    ids, weights = ids.cuda(), weights.cuda()
                    hidden = torch.randn(num_tokens, h, device="cuda").to(torch.bfloat16)
                    flat = ids.reshape(-1).long() - start
                    counts = torch.bincount(flat[(flat >= 0) & (flat < local)],
                                            minlength=local)
                    cost = moe_cost(ids, h, i, expert_start=start, local_experts=local)
                    policy = dispatch.plan_moe(num_tokens, k, local, h, i, global_num_experts=e,
                                               order=dispatch.WeightOrder.WPERM, mx=mx)
                    op_us = {}
                    for fx in args.flex:  # the op's own plan (hot tile included)
                        op = dispatch.plan_moe(num_tokens, k, local, h, i, global_num_experts=e,
                                               order=dispatch.WeightOrder.WPERM, mx=mx,
                                               flex=bool(fx))
                        call = functools.partial(moe_cuda.moe_forward, hidden, ids, weights,
                                                 *w, start, s.swiglu_limit, 1.0, plan=op)
                        op_us[fx] = time_one_call(call, args.reps, flush)
                        print(f"    op {'flex ' if fx else 'whole'} {op.block_m}"
                              f"{f' + hot {op.hot.routing.block_m}' if op.hot else ''}: "
                              f"{op_us[fx]:8.1f} us", flush=True)
                        expected = call() if (args.op_fields or w_other is not None
                                              or args.trim) else None
                        against_plan = functools.partial(time_against_plan, call, expected,
                                                         op_us[fx], args.reps, flush)

                        for variant, fields in zip(args.op_fields,
                                                   parse_fields(args.op_fields), strict=True):
                            varied = fielded(op, fields)
                            if varied is None:
                                print(f"    op +{variant}: refused by a config", flush=True)
                                continue
                            against_plan(functools.partial(call.func, *call.args,
                                                           **{**call.keywords, "plan": varied}),
                                         f"+{variant}")
                        if w_other is not None:
                            against_plan(functools.partial(moe_cuda.moe_forward, hidden, ids,
                                                           weights, *w_other, start,
                                                           s.swiglu_limit, 1.0, plan=op),
                                         f"{form} globals")
                        if args.trim and op.hot is not None:
                            # a hot class sizes P for its hot rows too: no single cut fits
                            print("    op trimmed: not measured (the plan has a hot tile)",
                                  flush=True)
                        elif args.trim:
                            bm = op.block_m
                            need = max(int(((counts + bm - 1) // bm).sum()), 1) * bm
                            print(f"    op P {op.num_rows} ({op.num_rows // bm} token tiles), "
                                  f"this routing needs {need} ({need // bm})", flush=True)
                            trimmed = dataclasses.replace(op, num_rows=need)
                            against_plan(functools.partial(call.func, *call.args,
                                                           **{**call.keywords,
                                                              "plan": trimmed}),
                                         "trimmed to the real tiles")
                    cells = {}
                    seen = set()
                    for bm, fx in [(bm, fx) for bm in args.tiles for fx in args.flex]:
                        try:
                            plan = dispatch.plan_moe(num_tokens, k, local, h, i,
                                                     global_num_experts=e, block_m=bm,
                                                     order=dispatch.WeightOrder.WPERM, mx=mx,
                                                     hot=False, flex=bool(fx))
                        except ValueError:
                            continue
                        if plan is None or plan.block_m != bm or plan in seen:
                            continue
                        seen.add(plan)
                        if len(args.flex) > 1:
                            bm = (bm, fx) if getattr(plan.gate_up.config, "flex", 0) else bm

                        call = functools.partial(moe_cuda.moe_forward, hidden, ids, weights,
                                                 *w, start, s.swiglu_limit, 1.0, plan=plan)

                        try:
                            cells[bm] = time_one_call(call, args.reps, flush)
                        except Exception as exc:  # noqa: BLE001 - report and go on
                            print(f"  bm {bm}: {type(exc).__name__}: {exc}"[:200])
                        if args.variants and bm in cells:
                            time_variants(plan, call, cells[bm], args, flush)
                    if policy.hot is not None:  # the op's own plan: its tile plus a hot one
                        for min_rows in args.hot_min:
                            hplan = with_hot_min(policy, num_tokens * k, local, min_rows)
                            call = functools.partial(moe_cuda.moe_forward, hidden, ids,
                                                     weights, *w, start, s.swiglu_limit, 1.0,
                                                     plan=hplan)
                            hot_us = time_one_call(call, args.reps, flush)
                            print(f"    policy {policy.block_m} + hot "
                                  f"{hplan.hot.routing.block_m} (min rows "
                                  f"{hplan.hot.routing.min_rows}, P {hplan.num_rows}): "
                                  f"{hot_us:8.1f} us", flush=True)
                    def tile(key):
                        return key[0] if isinstance(key, tuple) else key

                    need = {key: int(((counts + tile(key) - 1) // tile(key)).sum())
                            for key in cells}
                    best = min(cells, key=cells.get) if cells else None
                    line = " ".join(
                        f"{tile(key):>3d}{'f' if isinstance(key, tuple) else ''}"
                        f"{'*' if tile(key) == policy.block_m else ' '}{cells[key]:8.1f}"
                        f"[{need[key]}]" for key in cells)
                    if len(op_us) == 2:
                        line += f"  op whole/flex {op_us[0] / op_us[1]:.2f}"
                    print(f"{shape_name} ep{ep} T={num_tokens:<5d} {label:7s} "
                          f"local {int(counts.sum())} "
                          f"max/mean rows {int(counts.max())}/{counts.float().mean():.1f} "
                          f"roof {cost.roofline_us:7.1f}  {line}  best {best}", flush=True)
                    best_tile = f"{tile(best)}{'f' if isinstance(best, tuple) else ''}"
                    rows.append((shape_name, ep, num_tokens, label, policy.block_m, best_tile,
                                 op_us.get(1, op_us.get(0)), cells.get(best), op_us.get(0),
                                 op_us.get(1)))
    print("\nshape     ep  T      routing  policy  best  op_us    best_us  gain  whole_us "
          "flex_us  whole/flex")
    for shape_name, ep, t, routing, pol, best, pus, bus, whole, fl in rows:
        if pus and bus:
            ab = f"{whole:9.1f} {fl:8.1f} {whole / fl:6.2f}" if whole and fl else ""
            print(f"{shape_name:9s} {ep:<3d} {t:<6d} {routing:8s} {pol:<7d} {best:<5s} "
                  f"{pus:8.1f} {bus:8.1f} {pus / bus:5.2f} {ab}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
