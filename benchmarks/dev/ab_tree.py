"""A/B helper (diagnostics, needs a GPU): this tree's dense linear kernels against a baseline
tree's, in one process, the configs the dispatch picks on prepared (wfrag + wperm) weights.

Why: a change to a decoder or a kernel loop that keeps the configs (their names) but changes
the code behind them cannot be A/B'd by switching configs in one tree. Here the baseline's
``nvfp4_ops`` (a plain copy of the package folder, e.g. ``git archive main nvfp4_ops | tar -x
-C .baseline``; on the GPU machine, carry ``.baseline``) compiles in spawned workers that
import it first; its binaries land in its own cache folder (the cache key hashes the package
sources) and are launched with this tree's argument conventions, so both trees must agree on
the kernel signature (same config names: checked).

Cases: ``--nk`` shapes at ``--ms``. Checks first, on NaN-poisoned outputs: the two trees
bitwise equal (``--close``: within 1e-2 x max |this| instead). The launches use this tree's
launcher, so both trees must share the kernel signature; config names may differ between trees
(a renamed or dropped field), which is reported, not refused. The block scales take every
e4m3 byte but the two NaNs (zero, negative, subnormal too). Timing (``benchmarks/_timing.py``):
one call per CUDA-graph replay, L2 flushed by a read before every replay (``--flush``), the
trees alternating for ``--rounds`` rounds so clock drift hits both; median µs, with bf16
``torch.matmul``.

Uses internals: ``dispatch.plan_linear`` (or, in a baseline from before the dispatch module,
``linear_cuda.choose_config``), ``dispatch.plan_of_config``, ``linear_cuda.compiled`` /
``run_gemm`` / ``per_row_global_view``, ``_compile.cache_dir`` / ``_default_load``,
``cli.precompile.compile_configs``, ``orders.wfrag.to_wfrag``, ``orders.wperm.to_wperm``.

Both trees' binaries are launched through this tree's ``run_gemm``, so the baseline must take
the same twelve operands (trees from before the stream-K workspace got its own ``counters`` /
``scratch`` operands take ten and cannot be compared this way).

Usage: ``python benchmarks/dev/ab_tree.py --baseline DIR [--ms 1 16 32 128]
[--nk 7168x18432 18432x7168] [--close] [--reps 20] [--rounds 3] [--flush read|write]
[--jobs 8] [--out FILE.json]`` (DIR holds the baseline's ``nvfp4_ops`` folder).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

# no nvfp4_ops import at module level: the spawned workers import a baseline's first
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _timing import l2_flush, time_one_call  # noqa: E402


def linear_config(n: int, k: int, num_tokens: int, prepared: bool = True):
    """The config ``nvfp4::linear`` launches for ``num_tokens`` tokens on ``[n, k]`` weights
    (``prepared``: by ``to_wfrag_``, read as wfrag + wperm), from whichever ``nvfp4_ops`` this
    process imported (a baseline tree may predate the dispatch module)."""
    try:
        from nvfp4_ops.kernels.dispatch import WeightOrder, plan_linear
    except ImportError:
        from nvfp4_ops.kernels import linear_cuda as L

        bm = L.block_m_for_tokens(num_tokens)
        return L.choose_config(n, k, bm, "none", False, False,
                               min(-(-num_tokens // bm), L._m_tiles_cap()), wperm=prepared,
                               wfrag=prepared)
    order = WeightOrder.WFRAG if prepared else WeightOrder.CHECKPOINT
    return plan_linear(n, k, num_tokens, order=order).config


def alternate_cases(cases: dict[str, dict[str, Callable[[], object]]], rounds: int, reps: int,
                    flush: Callable[[], object]) -> dict[str, dict[str, float]]:
    """Time every variant of every case (``{case: {variant: fn}}``) as its own CUDA graph
    (:func:`_timing.time_one_call`), all interleaved in each of ``rounds`` rounds; returns
    ``{case: {variant: median µs over rounds}}``."""
    times: dict[tuple[str, str], list[float]] = {
        (case, name): [] for case, vs in cases.items() for name in vs}
    for _ in range(rounds):
        for (case, name), got in times.items():
            got.append(time_one_call(cases[case][name], reps, flush))
    med: dict[str, dict[str, float]] = {}
    for (case, name), got in times.items():
        med.setdefault(case, {})[name] = statistics.median(got)
    return med


def _use_baseline(root: str) -> None:
    """Worker initializer: import the baseline's ``nvfp4_ops`` (before anything else does)."""
    sys.path.insert(0, root)
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import nvfp4_ops

    where = Path(nvfp4_ops.__file__).resolve()
    if not where.is_relative_to(Path(root).resolve()):
        raise RuntimeError(f"baseline worker imported nvfp4_ops from {where}, not {root}")


def baseline_binary(nkm: tuple[int, int, int]) -> tuple[str, str]:
    """Worker: compile (or find on disk) the baseline's config for ``(n, k, m)``; returns its
    name and the path of its exported binary."""
    from nvfp4_ops import _compile
    from nvfp4_ops.kernels import linear_cuda

    cfg = linear_config(*nkm)
    # compiled (this layout) or compiled_gemm (trees from before the dispatch module)
    (getattr(linear_cuda, "compiled", None) or linear_cuda.compiled_gemm)(cfg)
    return cfg.name, str(_compile.cache_dir() / f"{cfg.name}.o")


def baseline_binaries(root: Path, cases: list[tuple[int, int, int]], jobs: int) -> dict:
    """``{(n, k, m): (name, path)}`` compiled by ``jobs`` workers importing ``root``."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_use_baseline,
                                                initargs=(str(root),)) as pool:
        out = dict(zip(cases, pool.map(baseline_binary, cases), strict=True))
    for i, (name, _) in enumerate(out.values()):
        print(f"[{i + 1}/{len(out)}] {name} (baseline)", flush=True)
    return out


def every_scale_byte(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """e4m3 block scales ``[n, k/16]`` drawn from every byte but the NaNs (0x7F, 0xFF)."""
    byte = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    return byte[torch.randint(0, byte.numel(), (n, k // 16), generator=gen)].view(
        torch.float8_e4m3fn)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=20,
                        help="timed CUDA-graph replays per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the medians to this JSON file")
    parser.add_argument("--baseline", type=Path, required=True,
                        help="folder holding the baseline's nvfp4_ops package")
    parser.add_argument("--ms", nargs="+", type=int, default=[1, 16, 32, 128])
    parser.add_argument("--nk", nargs="+", default=["7168x18432", "18432x7168"])
    parser.add_argument("--close", action="store_true",
                        help="accept outputs within 1e-2 x max |this| (default: bitwise)")
    parser.add_argument("--flush", choices=("write", "read"), default="read")
    parser.add_argument("--jobs", type=int, default=8)
    args = parser.parse_args(argv)
    if not (args.baseline / "nvfp4_ops" / "__init__.py").exists():
        print(f"--baseline {args.baseline}: no nvfp4_ops package there", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from nvfp4_ops import _compile
    from nvfp4_ops.cli.precompile import compile_configs
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels.dispatch import plan_of_config
    from nvfp4_ops.orders.wfrag import to_wfrag
    from nvfp4_ops.orders.wperm import to_wperm

    shapes = [tuple(int(v) for v in nk.split("x")) for nk in args.nk]
    keys = [(n, k, m) for n, k in shapes for m in args.ms]
    cfgs = {key: linear_config(*key) for key in keys}
    compile_configs(list(cfgs.values()), args.jobs, "this tree")
    base = baseline_binaries(args.baseline, keys, args.jobs)
    for key, cfg in cfgs.items():
        if base[key][0] != cfg.name:
            print(f"{key}: config names differ ({base[key][0]} vs {cfg.name}); comparing the "
                  "binaries anyway", flush=True)
    binaries = {"this": {cfg: L.compiled(cfg) for cfg in cfgs.values()},
                "base": {cfgs[key]: _compile._default_load(path, name)
                         for key, (name, path) in base.items()}}
    real = L.compiled

    def launcher(tree, cfg, x, w, ws, gv, out):
        plan = plan_of_config(cfg)

        def run():
            L.compiled = binaries[tree].__getitem__
            try:
                L.run_gemm(plan, x, w, ws, gv, out)
            finally:
                L.compiled = real
        return run

    flush = l2_flush(args.flush)
    cases: dict[str, dict] = {}
    for n, k in shapes:
        gen = torch.Generator().manual_seed(n)
        w = to_wperm(to_wfrag(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8,
                                            generator=gen))).cuda()[None]
        ws = every_scale_byte(n, k, gen).cuda()[None]
        gv = L.per_row_global_view(torch.rand(n, generator=gen).cuda() * 0.02 + 0.005, n)
        w_bf16 = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        for m in args.ms:
            cfg = cfgs[(n, k, m)]
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            outs = {t: torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                    for t in binaries}
            runs = {t: launcher(t, cfg, x, w, ws, gv, outs[t]) for t in binaries}
            for run in runs.values():
                run()
            label = f"{n}x{k} M={m} ({cfg.name.split('_', 1)[1][:40]})"
            this, other = outs["this"], outs["base"]
            if args.close:
                diff = (this.float() - other.float()).abs().max().item()
                ok = diff <= 1e-2 * this.float().abs().max().item()
            else:
                ok = torch.equal(this, other)
            if not ok or this.isnan().any() or other.isnan().any():
                print(f"{label}: CHECK FAILED (trees differ, or NaN in an output)")
                return 1
            print(f"{label}: {'close' if args.close else 'bitwise equal'}", flush=True)
            runs["bf16 matmul"] = lambda x=x, w_bf16=w_bf16: x @ w_bf16.t()
            cases[label] = runs
    med = alternate_cases(cases, args.rounds, args.reps, flush)
    print(f"{'case':62s} {'this':>8s} {'base':>8s} {'base/this':>9s} {'bf16/this':>10s}")
    for label, d in med.items():
        print(f"{label:62s} {d['this']:8.2f} {d['base']:8.2f} {d['base'] / d['this']:9.3f} "
              f"{d['bf16 matmul'] / d['this']:10.3f}")
    if args.out:
        args.out.write_text(json.dumps(med, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
