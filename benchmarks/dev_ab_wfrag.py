"""A/B helper (diagnostics, needs a GPU): dense linears on ``wfrag`` weights
(:mod:`nvfp4_ops.kernels.wfrag`) vs the checkpoint order, and tile sweeps on them.

Why: every dense family then decodes a lane's own u32 word with ``pair4`` against
natural-order activations. The streamed (M <= 8) and ``mma.sync`` (M = 16-32) kernels lose
their activation ``prmt``s, and the WGMMA kernel (M >= 64) its byte gathering, with no pass
over ``x``. The A/B runs of session 7 (``benchmarks/results/h200_2026-12-01_s7/ab/``) bound the
gain from above: the WGMMA ``kperm`` kernel was 7-12 % faster than natural at M <= 1024 (the
same decode path as ``wfrag``, but with one block scale per word instead of two), and ``wperm``
gave 0.92× / 0.97× on the streamed M = 1. ``wfrag`` needs all three families to win, since one
copy of the weights serves every M.

Cases: ``--nk`` shapes at ``--ms``, the dispatch's config (``linear_cuda.choose_config``):
``natural`` (what ships), ``wfrag`` (the same config reading ``wfrag.to_wfrag(w)``),
``wfrag+wperm`` (also ``wperm``: ``wperm.to_wperm(to_wfrag(w))``); at M = 16 / 32 also
``wgmma r1`` (the one-warpgroup 4-stage WGMMA tile on ``wfrag + wperm``, which beat ``mma.sync``
at N = 18432 in session 7); bf16 ``torch.matmul``. Checks first, on NaN-poisoned outputs:
``wfrag`` within fp32-order noise of ``natural`` (max abs diff <= 1e-2 x max |natural|),
``wfrag+wperm`` bitwise equal to ``wfrag``. Timing: CUDA graphs, L2 flushed before every replay,
variants alternating for ``--rounds`` rounds; median µs.

Usage: ``python benchmarks/dev_ab_wfrag.py [--ms 1 8 16 32 64 128 1024 8192]
[--nk 7168x18432 18432x7168 4096x4096] [--reps 20] [--rounds 3]
[--sweep stream|small|wgmma|box] [--flush write|read] [--jobs 8] [--out FILE.json]``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _ab  # noqa: E402

#: ``--sweep stream``: streamed-tile variants (``StreamConfig`` fields) on wfrag + wperm weights,
#: timed at 8-token tiles
STREAM_SWEEP = {
    "st6": dict(stages=6), "st8": dict(stages=8), "wk8 u1": dict(warps_k=8, steps=1),
    "wk8 u1 st6": dict(warps_k=8, steps=1, stages=6), "wk2 u4": dict(warps_k=2, steps=4),
    "t2": dict(tma2d=True), "t2 st3": dict(tma2d=True, stages=3),
    "t2 st6": dict(tma2d=True, stages=6), "t2 rows8": dict(tma2d=True, rows8=True),
    "t2 wk8 u1": dict(tma2d=True, warps_k=8, steps=1),
    "rows8": dict(rows8=True), "rg2": dict(row_groups=2), "ctas264": dict(ctas=264),
    "ctas396": dict(ctas=396), "rows8 ctas528": dict(rows8=True, ctas=528),
}
#: ``--sweep wgmma``: WGMMA tiles ``(block_m, row_wgs, split_k, stages)`` on wfrag + wperm
#: weights, timed at 64-128-token problems (the tiles of fewer stages let 2-3 CTAs share an SM)
WGMMA_SWEEP = {f"wg {bm}:{r}:{sk} st{st}": (bm, r, sk, st) for bm, r, sk, st in (
    (128, 4, 1, 8), (128, 2, 1, 8), (128, 2, 1, 5), (128, 2, 2, 8), (128, 1, 2, 8),
    (128, 1, 2, 4), (128, 1, 1, 4), (64, 1, 2, 8), (64, 2, 1, 4), (128, 3, 1, 8),
    (128, 3, 1, 6), (64, 3, 1, 8), (256, 2, 1, 6))}
#: stream-K WGMMA tiles ``(block_m, row_wgs, stages, streamk CTAs per SM)`` (with ``--sweep
#: wgmma`` at 64-256 tokens, ``--sweep small`` at 16-32)
WGMMA_STREAMK = {f"wg {bm}:{r} st{st} sk{sk}": (bm, r, st, sk) for bm, r, st, sk in (
    (128, 3, 6, 1), (128, 3, 8, 1), (128, 2, 8, 1), (128, 4, 8, 1), (128, 1, 4, 2),
    (128, 1, 4, 1), (256, 2, 6, 1), (64, 2, 4, 1), (64, 1, 4, 2),
    (16, 1, 6, 2), (16, 1, 6, 3), (16, 1, 4, 3), (16, 1, 4, 4), (16, 1, 5, 3),
    (16, 1, 8, 3), (16, 1, 8, 2), (32, 1, 6, 2), (32, 1, 4, 3), (32, 1, 5, 3), (32, 1, 6, 3),
    (32, 1, 8, 3), (32, 1, 8, 2))}
#: ``--sweep small``: at 16-32-token tiles, ``mma.sync`` variants (``GemmConfig`` fields) and
#: the small WGMMA tiles ``(row_wgs, split_k, stages)``, on wfrag + wperm weights
MMA_SWEEP = {
    "mma rg4": dict(row_groups=4), "mma rg1": dict(row_groups=1), "mma st3": dict(stages=3),
    "mma wk4 rg4": dict(warps_k=4, row_groups=4), "mma wn2": dict(warps_n=2),
    "mma wk16": dict(warps_k=16), "mma wn2 wk4": dict(warps_n=2, warps_k=4),
}
SMALL_WGMMA_SWEEP = {f"wg r{r} s{sk} st{st}": (r, sk, st) for r, sk, st in (
    (1, 1, 3), (1, 1, 6), (1, 1, 8), (2, 1, 4), (2, 1, 8))}


#: the variants every case has (a wrong one fails the run)
CORE = ("natural", "wfrag", "wfrag+wperm", "wgmma r1")
#: diagnostics, timed but not checked (their outputs are wrong on purpose): the dispatched
#: tile without the FP4 decode and block scales (``--sweep small`` / ``box``:
#: ``WgmmaConfig.decode``), also without the WGMMAs (``box``: ``WgmmaConfig.compute``);
#: ``--sweep stream``: ``StreamConfig.compute``, consumers only wait for and free each stage
DIAGNOSTIC = ("dispatch nodecode", "t2 nocompute", "nocompute", "nomma", "nosc")
#: ``--sweep box``: the dispatched stream-K tile with these ``WgmmaConfig`` fields replaced
BOX_SWEEP = {
    "nomma": dict(decode=False, compute=False),
    # without session 15's scales a stage ahead (the TMA scale box, converted at each stage)
    "no sa": dict(scale_ahead=False),
    # diagnostics: every stage reuses its output tile's first scales (no per-stage scale
    # load, conversion or shuffle; wrong outputs)
    "nosc": dict(scales=False),
}


def main(argv: list[str] | None = None) -> int:
    parser = _ab.parser(__doc__, tokens=[], reps=20)
    parser.add_argument("--ms", nargs="+", type=int, default=[1, 8, 16, 32, 64, 128, 1024, 8192])
    parser.add_argument("--nk", nargs="+", default=["7168x18432", "18432x7168", "4096x4096"],
                        help="weight shapes N x K")
    parser.add_argument("--sweep", choices=("stream", "small", "wgmma", "box"), action="append",
                        default=[],
                        help="also time tile variants on wfrag + wperm: streamed ones at "
                             "8-token tiles, mma.sync and small WGMMA ones at 16-32, WGMMA "
                             "ones at 64-128, and (box) the dispatched stream-K WGMMA tile at "
                             "16-128 with BOX_SWEEP's fields replaced (repeatable)")
    parser.add_argument("--flush", choices=("write", "read"), default="write",
                        help="how L2 is evicted before each replay (bench_moe.l2_flush)")
    parser.add_argument("--jobs", type=int, default=8,
                        help="compile every config first in this many worker processes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels.cute import w4a16_stream, w4a16_wgmma
    from nvfp4_ops.kernels.wfrag import to_wfrag
    from nvfp4_ops.kernels.wperm import to_wperm

    def configs(n: int, k: int, m: int) -> dict:
        bm = L.block_m_for_tokens(m)
        base = L.linear_config(n, k, m)
        cfgs = {"natural": (base, False), "wfrag": (dataclasses.replace(base, wfrag=True), False),
                "wfrag+wperm": (dataclasses.replace(base, wfrag=True, wperm=True), True)}
        if bm in (16, 32):
            cfgs["wgmma r1"] = (w4a16_wgmma.WgmmaConfig(
                n, k, "none", False, False, bm, 1, 1, 4, wfrag=True, wperm=True), True)
        tries = {}
        if "stream" in args.sweep and bm == 8:
            wp = cfgs["wfrag+wperm"][0]
            tries = {name: lambda kw=kw: dataclasses.replace(wp, **kw)
                     for name, kw in STREAM_SWEEP.items()}
            tries["nocompute"] = lambda: dataclasses.replace(wp, compute=False)
            tries["t2 nocompute"] = lambda: dataclasses.replace(wp, tma2d=True, compute=False)
        if "small" in args.sweep and bm in (16, 32):
            mma = L._choose_config(n, k, bm, "none", False, False, 1)
            if type(mma).__name__ == "GemmConfig":
                mma = dataclasses.replace(mma, wfrag=True, wperm=True)
                cfgs["mma base"] = (mma, True)
                tries = {name: lambda kw=kw: dataclasses.replace(mma, **kw)
                         for name, kw in MMA_SWEEP.items()}
            stream = w4a16_stream.choose_config(n, k, bm)
            tries.update({f"stream {name}": lambda kw=kw: dataclasses.replace(
                stream, wfrag=True, wperm=True, **kw) for name, kw in (
                    ("base", {}), ("fence st4", dict(release="fence", stages=4)),
                    ("wk8 u1", dict(warps_k=8, steps=1)))})
            tries.update({name: lambda t=t: w4a16_wgmma.WgmmaConfig(
                n, k, "none", False, False, bm, *t, wfrag=True, wperm=True)
                for name, t in SMALL_WGMMA_SWEEP.items()})
            shipped = L.linear_config(n, k, m, wfrag=True)
            if type(shipped).__name__ == "WgmmaConfig":
                cfgs["dispatch"] = (shipped, True)
                tries["dispatch nodecode"] = lambda s=shipped: dataclasses.replace(
                    s, decode=False)
        if "box" in args.sweep and bm in (16, 32, 128):
            shipped = L.linear_config(n, k, m, wfrag=True)
            if type(shipped).__name__ == "WgmmaConfig" and shipped.streamk:
                cfgs["dispatch"] = (shipped, True)
                tries["dispatch nodecode"] = lambda s=shipped: dataclasses.replace(
                    s, decode=False)
                # only rings that still fit the tile's CTAs per SM (227 KB of shared memory)
                fits = {name: dataclasses.replace(shipped, **kw) for name, kw in BOX_SWEEP.items()}
                tries.update({name: lambda c=c: c for name, c in fits.items()
                              if c.stage_bytes * c.num_stages * c.streamk <= 227 * 1024})
        if ("small" in args.sweep and bm in (16, 32)) or ("wgmma" in args.sweep
                                                           and bm in (64, 128, 256)):
            tries.update({name: lambda t=t: w4a16_wgmma.WgmmaConfig(
                n, k, "none", False, False, t[0], t[1], 1, t[2], wfrag=True, wperm=True,
                streamk=t[3]) for name, t in WGMMA_STREAMK.items() if t[0] == bm})
        if "wgmma" in args.sweep and bm in (64, 128, 256):
            # unverified tiles too: the check below drops a wrong one
            tries |= {name: lambda t=t: w4a16_wgmma.WgmmaConfig(
                n, k, "none", False, False, *t, wfrag=True, wperm=True, allow_unverified=True)
                for name, t in WGMMA_SWEEP.items()}
        for name, make in tries.items():
            try:
                cfgs[name] = (make(), True)
            except ValueError as exc:
                print(f"{n}x{k} {name}: skipped ({exc})")
        return cfgs

    shapes = [tuple(int(v) for v in nk.split("x")) for nk in args.nk]
    if args.jobs > 1:
        from nvfp4_ops.cli.precompile import compile_configs

        compile_configs([cfg for n, k in shapes for m in args.ms
                         for cfg, _ in configs(n, k, m).values()], args.jobs)
    import bench_moe

    flush = bench_moe.l2_flush(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"),
                               args.flush)
    cases: dict[str, dict] = {}
    for n, k in shapes:
        torch.manual_seed(n)
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        w_f = to_wfrag(w)
        w_fp = to_wperm(w_f)
        ws = (torch.rand(n, k // 16, device="cuda") + 0.25).to(torch.float8_e4m3fn)
        wg = torch.rand(n, device="cuda") * 0.02 + 0.005
        gv = L.per_row_global_view(wg, n)
        w_bf16 = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            cfgs = {v: (cfg, w_fp if wp else w_f if cfg.wfrag else w)
                    for v, (cfg, wp) in configs(n, k, m).items()}
            base = cfgs["natural"][0]
            outs = {v: torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for v in cfgs}

            def run(cfg, wt, out, x=x, gv=gv, ws=ws):
                return lambda: L._launch(cfg, x, None, wt[None], ws[None], gv, out, None, None,
                                         None)
            variants = {v: run(cfg, wt, outs[v]) for v, (cfg, wt) in cfgs.items()}
            variants["bf16 matmul"] = lambda x=x, w_bf16=w_bf16: x @ w_bf16.t()
            label = f"{n}x{k} M={m} ({base.name.split('_', 1)[1][:34]})"
            for v, out in outs.items():
                out.fill_(float("nan"))
                variants[v]()
            ref = outs["natural"].float()
            bad = []
            for v in outs:
                if v == "natural":
                    continue
                got = outs[v].float()
                if v in DIAGNOSTIC:
                    continue
                diff = (got - ref).abs().max().item() if torch.isfinite(got).all() else 1e30
                if diff > 1e-2 * ref.abs().max().item():
                    if v not in CORE:  # a wrong sweep variant is dropped, not fatal
                        print(f"{label} {v}: WRONG (max abs diff {diff:.3e}), not timed")
                        del variants[v]
                    else:
                        bad.append(f"{v} max abs diff {diff:.3e}")
            if not torch.equal(outs["wfrag"], outs["wfrag+wperm"]):
                bad.append("wfrag+wperm not bitwise equal to wfrag")
            if bad:
                print(f"{label}: CHECK FAILED ({'; '.join(bad)})")
                return 1
            print(f"{label}: checked", flush=True)
            cases[label] = variants
    med = _ab.alternate_cases(cases, args.rounds, args.reps, flush)
    names = ["natural", "wfrag", "wfrag+wperm", "wgmma r1", "bf16 matmul"]
    print(f"{'case':58s} " + " ".join(f"{v[:11]:>11s}" for v in names)
          + f" {'best/nat':>9s} {'bf16/best':>9s}")
    for label, d in med.items():
        best = min(us for v, us in d.items() if v not in ("natural", "bf16 matmul"))
        cells = " ".join(f"{d[v]:11.1f}" if v in d else f"{'-':>11s}" for v in names)
        print(f"{label:58s} {cells} {best / d['natural']:9.3f} {d['bf16 matmul'] / best:9.3f}")
    for label, d in med.items():
        if len(d) > len(names):
            _ab.print_vs_first(label, d, 24)
    if args.out:
        args.out.write_text(json.dumps(med, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
