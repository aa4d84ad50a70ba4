"""Dev check + timing of the WGMMA W4A16 kernel (``nvfp4_ops/kernels/cute/w4a16_wgmma.py``).

One call on an H200 does:

1. a smoke run in a child process (a pipeline deadlock kills only the child);
2. correctness against the exact fp32 reference of the dequantized weights on fresh random
   data, outputs NaN-poisoned first (unwritten rows fail), rows past ``P`` must stay NaN:
   dense ``none`` at several M for (4096, 4096), (7168, 18432), (18432, 7168), ``none + bias``,
   and grouped ``swiglu`` / ``row_scale`` at the V4-Flash MoE shapes with skipped tiles;
3. timing (CUDA graph of ``reps`` calls rotating over weight copies, so L2 is cold; CUDA
   events; median of several replays) of ours vs bf16 ``torch.matmul`` (dense) and vs bf16
   ``torch._grouped_mm`` (+ SwiGLU) with the same rows per expert (MoE GEMM pair).

Error bound as ``tests/test_linear_gpu.py``: rel L2 <= 1.05 * (bf16 rounding of the reference)
+ 1e-5, and every element within 1 bf16 ulp (+ 1e-5 * max) of the reference.

Run: ``python benchmarks/dev_wgmma.py``; prints a table, writes JSON to ``--json``.

Config sweep (``--sweep``): tile configs ``block_m:row_wgs:split_k[:stages]`` (``--specs``) on
the dense shapes. Every config is first checked (M = 128 and 199, M = 1024 for 256-row tiles;
``none``, and for split-K configs also ``swiglu`` and ``none + bias``) in child processes; a
child that hangs (pipeline or ``setmaxnreg`` deadlock) is killed, its config reported HUNG and
the next child goes on after it. Only the configs that passed are then timed at ``--ms``
against bf16 ``torch.matmul`` (same shapes, same run; three weight copies, so (4096, 4096)
stays in L2: use ``bench_linear.py`` for its cold-L2 time). Binaries go through the package's
disk cache (compiled first by a process pool), so the children and the parent load them.
``--grouped-check`` adds the grouped ``swiglu`` / ``row_scale`` check of ``choose_config``'s
small tiles (16, 32, 64).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import multiprocessing
import os
import subprocess
import sys
import time

import torch
from _timing import capture, replay_median_us

from nvfp4_ops import _compile

_compile.ensure_cutlass_env()

from nvfp4_ops.kernels.cute import w4a16_wgmma as wg  # noqa: E402
from nvfp4_ops.kernels.linear_cuda import per_row_global_view  # noqa: E402
from nvfp4_ops.reference import linear_fp32  # noqa: E402
from nvfp4_ops.reference.mlp import clamped_swiglu  # noqa: E402

DENSE = [(4096, 4096), (7168, 18432), (18432, 7168)]
MS = [64, 128, 199, 1024, 8192]
_fns: dict[str, object] = {}


def compiled(cfg):
    """The binary for ``cfg`` (package disk cache: a child's compile serves the parent), called
    with this script's per-row ``w_global [G, N]``: passed as the binary's ``[G, H2, N/H2]``
    view."""
    fn = _fns.get(cfg.name)
    if fn is None:
        t = time.time()
        binary = _compile.get_compiled(cfg, lambda: wg.compile_gemm(cfg))
        halves = 2 if cfg.epilogue == "swiglu" else 1

        def fn(a, w, w_scale, w_global, *rest, binary=binary, halves=halves):
            return binary(a, w, w_scale, per_row_global_view(w_global, cfg.n, halves), *rest)

        _fns[cfg.name] = fn
        print(f"  compiled/loaded {cfg.name} in {time.time() - t:.1f} s", flush=True)
    return fn


def random_nvfp4(groups, n, k, gen):
    w = torch.randint(0, 256, (groups, n, k // 2), dtype=torch.uint8, device="cuda",
                      generator=gen)
    sc = (torch.rand(groups, n, k // 16, device="cuda", generator=gen) * 3.0 + 2.0**-9)
    w_scale = sc.to(torch.float8_e4m3fn)
    w_global = torch.rand(groups, n, device="cuda", generator=gen) * 0.01 + 1e-3
    return w, w_scale, w_global


def dummies():
    return (torch.zeros(1, dtype=torch.int32, device="cuda"),
            torch.zeros(1, dtype=torch.float32, device="cuda"),
            torch.zeros(1, dtype=torch.bfloat16, device="cuda"))


def call(cfg, a, w, w_scale, w_global, out, tile_expert=None, row_scale=None, bias=None,
         limit=float("inf")):
    d_te, d_rs, d_b = dummies() if not hasattr(call, "d") else call.d
    call.d = (d_te, d_rs, d_b)
    compiled(cfg)(a, w, w_scale.view(torch.uint8), w_global, out,
                  d_te if tile_expert is None else tile_expert,
                  d_te,  # tile_rows: the WGMMA family does not read it
                  d_rs if row_scale is None else row_scale,
                  d_b if bias is None else bias, limit)


def sync_or_die(what: str, seconds: float = 30.0) -> None:
    """``torch.cuda.synchronize`` with a deadline: a hung kernel (pipeline deadlock) ends the
    process with a message instead of running into the device time limit."""
    ev = torch.cuda.Event()
    ev.record()
    deadline = time.time() + seconds
    while not ev.query():
        if time.time() > deadline:
            print(f"HUNG: {what} did not finish in {seconds:.0f} s; exiting", flush=True)
            os._exit(3)
        time.sleep(0.001)


def errors(out, ref):
    ref = ref.float()
    out = out.float()
    nan = torch.isnan(out).any().item()
    norm = ref.norm().clamp_min(1e-30)
    err = ((out - ref).norm() / norm).item()
    err_round = ((ref.to(torch.bfloat16).float() - ref).norm() / norm).item()
    tol = ref.abs() * 2.0**-7 + ref.abs().max() * 1e-5
    bad = ((out - ref).abs() > tol).sum().item()
    ok = (not nan) and err <= err_round * 1.05 + 1e-5 and bad == 0
    return ok, err, err_round, bad, nan


# ------------------------------------------------------------------------------ correctness


def check_dense(results, cfgs_for, gen):
    for n, k in DENSE:
        w, w_scale, w_global = random_nvfp4(1, n, k, gen)
        for m in MS:
            x = torch.randn(m + 3, k, device="cuda", generator=gen).to(torch.bfloat16)[:m]
            ref = linear_fp32(x, w[0], w_scale[0], w_global[0])
            for cfg in cfgs_for(n, k, m):
                out = torch.full((m + 5, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                call(cfg, x, w, w_scale, w_global, out)
                sync_or_die(f"{cfg.name} M={m}")
                ok, err, er, bad, nan = errors(out[:m], ref)
                tail_ok = torch.isnan(out[m:]).all().item()
                ok = ok and tail_ok
                results.append(dict(kind="check", cfg=cfg.name, m=m, ok=ok, err=err,
                                    err_round=er, bad=bad))
                print(f"  {'ok  ' if ok else 'FAIL'} {cfg.name:58s} M={m:5d} relL2 {err:.2e} "
                      f"(round {er:.2e}) bad {bad} tail_untouched {tail_ok}", flush=True)
    # bias
    n, k = 4096, 4096
    w, w_scale, w_global = random_nvfp4(1, n, k, gen)
    bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    for m in (77, 300):
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        ref = linear_fp32(x, w[0], w_scale[0], w_global[0]) + bias.float()
        cfg = wg.choose_config(n, k, 128, "none", True, False)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        call(cfg, x, w, w_scale, w_global, out, bias=bias)
        sync_or_die("bias check")
        ok, err, er, bad, nan = errors(out, ref)
        results.append(dict(kind="check", cfg=cfg.name, m=m, ok=ok, err=err, bad=bad))
        print(f"  {'ok  ' if ok else 'FAIL'} {cfg.name:58s} M={m:5d} relL2 {err:.2e} "
              f"(round {er:.2e}) bad {bad}", flush=True)


def check_grouped(results, gen, tiles):
    groups, h, inter = 5, 4096, 2048
    w13, w13s, w13g = random_nvfp4(groups, 2 * inter, h, gen)
    w2, w2s, w2g = random_nvfp4(groups, h, inter, gen)
    limit = 7.0
    for bm, r, sk in tiles:
        tile_expert = torch.tensor([2, -1, 0, 4, 1, -1, 3], dtype=torch.int32, device="cuda")
        rows = tile_expert.numel() * bm - 5
        a = torch.randn(rows, h, device="cuda", generator=gen).to(torch.bfloat16)
        act = torch.randn(rows, inter, device="cuda", generator=gen).to(torch.bfloat16)
        row_scale = torch.rand(rows, device="cuda", generator=gen)
        cfg1 = wg.WgmmaConfig(2 * inter, h, "swiglu", False, True, bm, r, sk)
        cfg2 = wg.WgmmaConfig(h, inter, "row_scale", False, True, bm, r, sk)
        out1 = torch.full((rows, inter), float("nan"), dtype=torch.bfloat16, device="cuda")
        out2 = torch.full((rows, h), float("nan"), dtype=torch.bfloat16, device="cuda")
        call(cfg1, a, w13, w13s, w13g, out1, tile_expert=tile_expert, limit=limit)
        call(cfg2, act, w2, w2s, w2g, out2, tile_expert=tile_expert, row_scale=row_scale)
        sync_or_die(f"{cfg1.name} / {cfg2.name}")
        ok1 = ok2 = True
        worst1 = worst2 = 0.0
        for t, e in enumerate(tile_expert.tolist()):
            sl = slice(t * bm, min((t + 1) * bm, rows))
            if e < 0:
                ok1 &= torch.isnan(out1[sl]).all().item()
                ok2 &= torch.isnan(out2[sl]).all().item()
                continue
            r1 = linear_fp32(a[sl], w13[e], w13s[e], w13g[e])
            ref1 = clamped_swiglu(r1[:, :inter], r1[:, inter:], limit)
            o1 = out1[sl].float()
            e1 = ((o1 - ref1).norm() / ref1.norm()).item()
            worst1 = max(worst1, e1)
            ok1 &= (not torch.isnan(o1).any().item()) and e1 < 4e-3
            ref2 = linear_fp32(act[sl], w2[e], w2s[e], w2g[e]) * row_scale[sl, None]
            ok, err, er, bad, nan = errors(out2[sl], ref2)
            worst2 = max(worst2, err)
            ok2 &= ok
        for cfg, ok, worst in ((cfg1, ok1, worst1), (cfg2, ok2, worst2)):
            results.append(dict(kind="check", cfg=cfg.name, m=rows, ok=bool(ok), err=worst))
            print(f"  {'ok  ' if ok else 'FAIL'} {cfg.name:58s} P={rows:5d} worst relL2 "
                  f"{worst:.2e} (skipped tiles untouched checked)", flush=True)


# ------------------------------------------------------------------------------ timing


def time_graph(fns, reps, replays=7):
    """Median device time per call of ``fns`` (called round-robin, ``reps`` per graph)."""
    fns[0]()
    sync_or_die("timing warm-up")
    graph = capture([fns[i % len(fns)] for i in range(reps)])
    graph.replay()
    sync_or_die("timing graph")
    return replay_median_us(graph, replays, calls_per_replay=reps)


def bench_dense(results, gen, cases):
    for n, k in [(7168, 18432), (18432, 7168)]:
        copies = 3
        ws = [random_nvfp4(1, n, k, gen) for _ in range(copies)]
        wb = [torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16)
              for _ in range(2)]
        for m, cfgs in cases:
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            reps = 20 if m <= 1024 else 4
            t_bf16 = time_graph([functools.partial(torch.matmul, x, b.t()) for b in wb], reps)
            flops = 2.0 * m * n * k
            print(f"  bf16 matmul   N={n} K={k} M={m:5d}: {t_bf16:8.1f} us "
                  f"{flops / t_bf16 / 1e6:6.0f} TFLOP/s", flush=True)
            for cfg in cfgs:
                cfg = wg.WgmmaConfig(n, k, "none", False, False, *cfg)
                compiled(cfg)
                fns = [functools.partial(call, cfg, x, c[0], c[1], c[2], out) for c in ws]
                t = time_graph(fns, reps)
                wbytes = n * k * 9 / 16
                row = dict(kind="dense", n=n, k=k, m=m, cfg=cfg.name, us=t, bf16_us=t_bf16,
                           tflops=flops / t / 1e6, tbps=wbytes / t / 1e6, speedup=t_bf16 / t)
                results.append(row)
                print(f"  ours {cfg.name:58s} M={m:5d}: {t:8.1f} us {row['tflops']:6.0f} "
                      f"TFLOP/s {row['tbps']:5.2f} TB/s  x{row['speedup']:.2f} vs bf16",
                      flush=True)
        del ws, wb
        torch.cuda.empty_cache()


def _bf16_pair(xb, w13b, w2b, offs, inter):
    y = torch._grouped_mm(xb, w13b, offs=offs)
    act = torch.nn.functional.silu(y[:, :inter]) * y[:, inter:]
    return torch._grouped_mm(act, w2b, offs=offs)


def bench_moe(results, gen, token_counts):
    e, h, inter, top_k = 256, 4096, 2048, 6
    w13, w13s, w13g = random_nvfp4(e, 2 * inter, h, gen)
    w2, w2s, w2g = random_nvfp4(e, h, inter, gen)
    w13b = torch.randn(e, h, 2 * inter, device="cuda", generator=gen).to(torch.bfloat16)
    w2b = torch.randn(e, inter, h, device="cuda", generator=gen).to(torch.bfloat16)
    for t_tokens, bm, r in token_counts:
        ids = torch.rand(t_tokens, e, device="cuda", generator=gen).topk(top_k).indices
        counts = torch.bincount(ids.flatten(), minlength=e)
        rows_total = int(counts.sum())
        # bf16 baseline: unpadded segments
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xb = torch.randn(rows_total, h, device="cuda", generator=gen).to(torch.bfloat16)

        # ours: each expert segment padded to block_m
        tiles = ((counts + bm - 1) // bm).tolist()
        tile_expert = torch.tensor(sum(([i] * c for i, c in enumerate(tiles)), []),
                                   dtype=torch.int32, device="cuda")
        p = tile_expert.numel() * bm
        a = torch.randn(p, h, device="cuda", generator=gen).to(torch.bfloat16)
        act = torch.empty(p, inter, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(p, h, dtype=torch.bfloat16, device="cuda")
        row_scale = torch.rand(p, device="cuda", generator=gen)
        cfg1 = wg.WgmmaConfig(2 * inter, h, "swiglu", False, True, bm, r, 1)
        cfg2 = wg.WgmmaConfig(h, inter, "row_scale", False, True, bm, r, 1)

        g1 = functools.partial(call, cfg1, a, w13, w13s, w13g, act, tile_expert=tile_expert,
                               limit=10.0)
        g2 = functools.partial(call, cfg2, act, w2, w2s, w2g, out, tile_expert=tile_expert,
                               row_scale=row_scale)
        reps = 10
        t_b = time_graph([functools.partial(_bf16_pair, xb, w13b, w2b, offs, inter)], reps)
        t_o = time_graph([g1, g2], 2 * reps) * 2
        t_1 = time_graph([g1], reps)
        used = int((counts > 0).sum())
        flops = 6.0 * rows_total * h * inter
        row = dict(kind="moe", tokens=t_tokens, bm=bm, used_experts=used, rows=rows_total,
                   padded_rows=p, us=t_o, us_gemm1=t_1, bf16_us=t_b, speedup=t_b / t_o,
                   tflops=flops / t_o / 1e6, cfg1=cfg1.name, cfg2=cfg2.name)
        results.append(row)
        print(f"  moe T={t_tokens:6d} bm={bm:3d} r={r} rows/used expert {rows_total / used:6.1f}: "
              f"ours {t_o:8.1f} us (gemm1 {t_1:7.1f}) bf16 {t_b:8.1f} us  x{t_b / t_o:.2f} "
              f"{row['tflops']:.0f} TFLOP/s", flush=True)


# ------------------------------------------------------------------------------ config sweep

#: default sweep: the current tiles, one row warpgroup, in-CTA split-K, four row warpgroups,
#: two CTAs per SM (bm128 r1 with 4 stages: 109 registers x 256 threads, 74 KB)
SWEEP_SPECS = ("128:2:1", "128:1:1", "128:1:2", "128:1:4", "128:2:2", "128:4:1", "128:1:1:4",
               "64:2:1", "64:1:2", "256:2:1", "256:1:2")
SWEEP_MS = (128, 199, 512, 1024)


def parse_spec(spec: str) -> tuple[int, int, int, int]:
    parts = [int(v) for v in spec.split(":")]
    return tuple(parts + [0] * (4 - len(parts)))  # block_m, row_wgs, split_k, stages


def spec_cfg(spec: str, n: int, k: int, epilogue: str = "none", has_bias: bool = False):
    bm, r, sk, st = parse_spec(spec)
    return wg.WgmmaConfig(n, k, epilogue, has_bias, False, bm, r, sk, st, allow_unverified=True)


def probe(specs, grouped_check: bool) -> None:
    """Child process: correctness of each spec; prints PROBE-START / PROBE lines. A hang
    ends the process (sync_or_die), the parent restarts after the hung spec."""
    gen = torch.Generator(device="cuda").manual_seed(4321)
    weights = {nk: random_nvfp4(1, *nk, gen) for nk in DENSE}
    xs = {}
    for spec in specs:
        print(f"PROBE-START {spec}", flush=True)
        bm = parse_spec(spec)[0]
        ok_all = True
        for (n, k), (w, w_scale, w_global) in weights.items():
            try:
                cfg = spec_cfg(spec, n, k)
            except ValueError as exc:
                print(f"PROBE skip {spec} N={n} K={k}: {exc}", flush=True)
                continue
            for m in ((1024, 199) if bm == 256 else (128, 199)):
                if (k, m) not in xs:
                    xs[(k, m)] = torch.randn(m, k, device="cuda", generator=gen).to(
                        torch.bfloat16)
                x = xs[(k, m)]
                ref = linear_fp32(x, w[0], w_scale[0], w_global[0])
                out = torch.full((m + 5, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                call(cfg, x, w, w_scale, w_global, out)
                sync_or_die(f"{cfg.name} M={m}", 20.0)
                ok, err, er, bad, nan = errors(out[:m], ref)
                ok = ok and torch.isnan(out[m:]).all().item()
                ok_all &= ok
                print(f"PROBE {'ok  ' if ok else 'FAIL'} {spec:10s} {cfg.name:58s} M={m:5d} "
                      f"relL2 {err:.2e} (round {er:.2e}) bad {bad}", flush=True)
        if parse_spec(spec)[2] > 1 or parse_spec(spec)[1] > 2:
            ok_all &= probe_epilogues(spec, gen)
        print(f"PROBE-DONE {spec} {'ok' if ok_all else 'FAIL'}", flush=True)
    if grouped_check:
        results = []
        check_grouped(results, gen, [(bm, 2, 1) for bm in (16, 32, 64)])
        print(f"PROBE-GROUPED {'ok' if all(r['ok'] for r in results) else 'FAIL'}", flush=True)


def probe_epilogues(spec: str, gen) -> bool:
    """``swiglu`` (dense, gate rows then up rows) and ``none + bias`` at (4096, 4096)."""
    n, k, limit = 4096, 4096, 7.0
    w, w_scale, w_global = random_nvfp4(1, n, k, gen)
    bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    ok_all = True
    for m in (77, 300):
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        r = linear_fp32(x, w[0], w_scale[0], w_global[0])
        cfg = spec_cfg(spec, n, k, "swiglu")
        out = torch.full((m, n // 2), float("nan"), dtype=torch.bfloat16, device="cuda")
        call(cfg, x, w, w_scale, w_global, out, limit=limit)
        sync_or_die(f"{cfg.name} M={m}", 20.0)
        ref = clamped_swiglu(r[:, : n // 2], r[:, n // 2:], limit)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        ok = (not torch.isnan(out).any().item()) and err < 4e-3
        print(f"PROBE {'ok  ' if ok else 'FAIL'} {spec:10s} {cfg.name:58s} M={m:5d} "
              f"relL2 {err:.2e} (swiglu, bound 4e-3)", flush=True)
        cfg = spec_cfg(spec, n, k, "none", True)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        call(cfg, x, w, w_scale, w_global, out, bias=bias)
        sync_or_die(f"{cfg.name} M={m}", 20.0)
        ok2, err2, er, bad, nan = errors(out, r + bias.float())
        print(f"PROBE {'ok  ' if ok2 else 'FAIL'} {spec:10s} {cfg.name:58s} M={m:5d} "
              f"relL2 {err2:.2e} (round {er:.2e}) bad {bad}", flush=True)
        ok_all &= ok and ok2
    return ok_all


def run_probes(specs, grouped_check: bool, timeout: float) -> tuple[list[str], dict]:
    """Run :func:`probe` in children until every spec is done or hung; returns the specs that
    passed and a status per spec (ok / FAIL / HUNG)."""
    status: dict[str, str] = {}
    todo = list(specs)
    while todo or grouped_check:
        cmd = [sys.executable, __file__, "--probe", "--specs", *todo]
        if grouped_check:
            cmd.append("--grouped-check")
        try:
            r = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True)
            text, crashed = r.stdout, r.returncode != 0
            if crashed:
                print(r.stderr[-2000:], flush=True)
        except subprocess.TimeoutExpired as exc:
            text = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            crashed = True
        current = None
        for line in text.splitlines():
            if line.startswith(("PROBE", "HUNG", "  ok", "  FAIL")):
                print(line, flush=True)
            if line.startswith("PROBE-START"):
                current = line.split()[1]
            elif line.startswith("PROBE-DONE"):
                _, spec, verdict = line.split()
                status[spec] = verdict
                current = None
            elif line.startswith("PROBE-GROUPED"):
                status["grouped"] = line.split()[1]
                grouped_check = False
        if crashed and current is not None:
            status[current] = "HUNG"
            print(f"PROBE HUNG/CRASHED {current}", flush=True)
        elif crashed and grouped_check:
            status["grouped"] = "HUNG"
            grouped_check = False
        done = set(status)
        todo = [s for s in todo if s not in done]
        if crashed and current is None and todo:  # died outside any spec: do not loop
            for s in todo:
                status[s] = "CRASHED"
            todo = []
        if not crashed:
            grouped_check = False
    return [s for s in specs if status.get(s) == "ok"], status


def bench_sweep(results, gen, specs, ms) -> None:
    """Time every passing spec at every M (skip tiles far from M) on the dense shapes."""
    for n, k in DENSE:
        copies = 3
        ws = [random_nvfp4(1, n, k, gen) for _ in range(copies)]
        wb = [torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16)
              for _ in range(2)]
        for m in ms:
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            reps = 20 if m <= 1024 else 4
            t_bf16 = time_graph([functools.partial(torch.matmul, x, b.t()) for b in wb], reps)
            flops = 2.0 * m * n * k
            results.append(dict(kind="bf16", n=n, k=k, m=m, us=t_bf16))
            print(f"  bf16 matmul   N={n:5d} K={k:5d} M={m:5d}: {t_bf16:8.1f} us "
                  f"{flops / t_bf16 / 1e6:6.0f} TFLOP/s", flush=True)
            for spec in specs:
                bm = parse_spec(spec)[0]
                if (m > 1024 and bm < 256) or (m <= 199 and bm == 256) or bm > 2 * m:
                    continue
                try:
                    cfg = spec_cfg(spec, n, k)
                except ValueError:
                    continue
                compiled(cfg)
                fns = [functools.partial(call, cfg, x, c[0], c[1], c[2], out) for c in ws]
                t = time_graph(fns, reps)
                ctas = cfg.n_out // cfg.features_per_cta * ((m + bm - 1) // bm)
                row = dict(kind="sweep", n=n, k=k, m=m, spec=spec, cfg=cfg.name, us=t,
                           bf16_us=t_bf16, tflops=flops / t / 1e6, speedup=t_bf16 / t,
                           ctas=ctas)
                results.append(row)
                print(f"  SWEEP N={n:5d} K={k:5d} M={m:5d} {spec:10s} ctas {ctas:4d}: "
                      f"{t:8.1f} us {row['tflops']:5.0f} TFLOP/s x{row['speedup']:.2f} vs bf16",
                      flush=True)
        del ws, wb
        torch.cuda.empty_cache()


def sweep_table(results) -> None:
    """Last lines of the log: per (N, K, M) the bf16 time and the specs sorted by time."""
    print("== sweep summary (us; x = speed-up vs bf16 matmul, same run)", flush=True)
    keys = sorted({(r["n"], r["k"], r["m"]) for r in results if r["kind"] == "sweep"})
    for n, k, m in keys:
        rows = sorted((r for r in results if r["kind"] == "sweep" and (r["n"], r["k"], r["m"])
                       == (n, k, m)), key=lambda r: r["us"])
        best = "  ".join(f"{r['spec']}={r['us']:.1f}" for r in rows)
        print(f"  N={n:5d} K={k:5d} M={m:5d} bf16 {rows[0]['bf16_us']:7.1f} | best x"
              f"{rows[0]['speedup']:.2f} | {best}", flush=True)


def _compile_one(cfg) -> str:
    compiled(cfg)
    return cfg.name


def precompile(specs, workers: int = 12) -> None:
    """Compile every config the probes and the timing use, in parallel processes (CPU only),
    into the disk cache."""
    cfgs = {}
    for spec in specs:
        bm, r, sk, _ = parse_spec(spec)
        variants = [(n, k, "none", False) for n, k in DENSE]
        if sk > 1 or r > 2:
            variants += [(4096, 4096, "swiglu", False), (4096, 4096, "none", True)]
        for n, k, epi, bias in variants:
            try:
                cfg = spec_cfg(spec, n, k, epi, bias)
            except ValueError:
                continue
            cfgs[cfg.name] = cfg
    t = time.time()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        for _ in pool.map(_compile_one, cfgs.values()):
            pass
    print(f"  precompiled {len(cfgs)} configs in {time.time() - t:.0f} s", flush=True)


def main_sweep(args) -> None:
    results = []
    t0 = time.time()
    print("== precompile (disk cache)", flush=True)
    precompile(args.specs)
    print("== probes (child processes, hang-safe)", flush=True)
    passed, status = run_probes(args.specs, args.grouped_check, args.probe_timeout)
    results.append(dict(kind="probe", status=status))
    print(f"   probe status {status} ({time.time() - t0:.0f} s)", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(99)
    print("== sweep timing", flush=True)
    bench_sweep(results, gen, passed, args.ms)
    print(f"   ({time.time() - t0:.0f} s)", flush=True)
    with open(args.json, "w") as fh:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       results=results), fh, indent=1)
    sweep_table(results)


def smoke():
    gen = torch.Generator(device="cuda").manual_seed(0)
    w, s, g = random_nvfp4(1, 256, 512, gen)
    x = torch.randn(70, 512, device="cuda", generator=gen).to(torch.bfloat16)
    cfg = wg.choose_config(256, 512, 64)
    out = torch.full((70, 256), float("nan"), dtype=torch.bfloat16, device="cuda")
    call(cfg, x, w, s, g, out)
    sync_or_die("smoke")
    ok, err, er, bad, nan = errors(out, linear_fp32(x, w[0], s[0], g[0]))
    print(f"smoke: ok={ok} relL2 {err:.2e} round {er:.2e} bad {bad} nan {nan}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "/tmp"),
                                                   "wgmma_dev.json"))
    ap.add_argument("--sweep", action="store_true", help="config sweep (module docstring)")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--specs", nargs="*", default=list(SWEEP_SPECS))
    ap.add_argument("--ms", nargs="+", type=int, default=list(SWEEP_MS))
    ap.add_argument("--grouped-check", action="store_true")
    ap.add_argument("--probe-timeout", type=float, default=150.0)
    args = ap.parse_args()
    if args.smoke:
        smoke()
        return
    if args.probe:
        probe(args.specs, args.grouped_check)
        return
    if args.sweep:
        main_sweep(args)
        return
    print("== smoke (child process, 120 s limit)", flush=True)
    try:
        r = subprocess.run([sys.executable, __file__, "--smoke"], timeout=120,
                           capture_output=True, text=True)
        print(r.stdout[-3000:], r.stderr[-3000:], flush=True)
        if r.returncode != 0 or "ok=True" not in r.stdout:
            print("smoke failed: stopping", flush=True)
            return
    except subprocess.TimeoutExpired:
        print("smoke HUNG (deadlock?): stopping", flush=True)
        return
    gen = torch.Generator(device="cuda").manual_seed(1234)
    results = []
    t0 = time.time()
    if not args.skip_check:
        print("== correctness", flush=True)

        def cfgs_for(n, k, m):
            if m <= 128:
                tiles = [(64, 1, 1), (128, 1, 1), (128, 2, 1)]
            elif m <= 199:
                tiles = [(128, 2, 1)]
            else:
                tiles = [(128, 2, 1), (256, 2, 1)]
            return [wg.WgmmaConfig(n, k, "none", False, False, *t) for t in tiles]

        check_dense(results, cfgs_for, gen)
        check_grouped(results, gen, [(16, 2, 1), (64, 2, 1), (128, 2, 1), (256, 2, 1)])
        print(f"   ({time.time() - t0:.0f} s)", flush=True)
    print("== dense timing", flush=True)
    bench_dense(results, gen, [
        (128, [(128, 1, 1), (128, 2, 1), (64, 1, 1)]),
        (8192, [(256, 2, 1), (128, 2, 1)]),
    ])
    print(f"   ({time.time() - t0:.0f} s)", flush=True)
    print("== moe timing (V4-Flash GEMM pair, uniform top-6 routing)", flush=True)
    bench_moe(results, gen, [(512, 16, 2), (512, 32, 2), (4096, 64, 2), (4096, 128, 2),
                             (16384, 128, 2), (16384, 256, 2)])
    with open(args.json, "w") as fh:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                       results=results), fh, indent=1)
    fails = [r for r in results if r.get("kind") == "check" and not r["ok"]]
    print(f"== done in {time.time() - t0:.0f} s; {len(fails)} check failures", flush=True)


if __name__ == "__main__":
    main()
