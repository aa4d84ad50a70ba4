"""Benchmark ``nvfp4::linear`` (CuTeDSL W4A16 GEMM) against ``torch.matmul`` in bf16.

Timing (``benchmarks/_timing.py`` states the method): by default one call per CUDA-graph
replay, L2 flushed before every timed replay by reading a 256 MiB buffer, the median of 50
replays, in microseconds per call: single-call latency with cold weights and activations.
``--chain`` times throughput instead, the method of the committed ``results/linear_h200.log``:
each op is captured ``reps`` times into one CUDA graph (20 calls, 5 at M > 1024), cycling over
``sets`` weight sets (cold weights: the 50 MB L2 of an H200 cannot hold the rotation), no
flush; the graph is replayed 30 times and the median replay / reps is reported. Back-to-back
calls overlap each other's launch and tail, so chained figures read lower than single calls.
The NVFP4 op and its bf16 baseline are always timed back to back, with the same method.

Reported per (M, N, K):
* ``us``: median device time per call;
* ``TB/s``: effective bandwidth over the weight bytes only, ``0.5625 * N * K`` (4-bit codes +
  one e4m3 scale per 16) for NVFP4 and ``2 * N * K`` for bf16;
* ``TFLOP/s`` = ``2 M N K / t``; ``%roof`` = ``t_floor / t`` with
  ``t_floor = max(bytes / 4.1 TB/s, 2 M N K / 790 TFLOP/s)`` (measured H200 copy bandwidth and
  bf16 matmul rate, ../shared/REFERENCE.md section 4) using the NVFP4 byte count;
* ``speedup`` = bf16 time / NVFP4 time.

Case order (``--order``): ``m`` (default) runs every shape's smallest M first and the largest
last; ``shape`` runs all M of one shape, then the next. It matters on an H200: the decode
kernels are bound by the SMs' issue rate, and after the seconds of M = 8192 tensor-core work the
SM clock is lower for a while, so in ``shape`` order the M = 1 cases of the second and later
shapes came out ~25 % slower (H200: (18432, 7168) M = 1 39.9 us after (7168, 18432) M = 8192,
31.6 us run first; the memory-bound bf16 M = 1 baseline moved ~3 %; ``nvfp4_ops/kernels/
DESIGN.md``, "Timing").

Weight order (``--weight-order``): ``wfrag`` (default: the
weights prepared by ``nvfp4.to_wfrag_`` and the op called with ``wfrag=True``, as the vLLM glue
does on CUDA by default, ``NVFP4_OPS_DENSE_WFRAG``) or ``checkpoint`` (the weights as stored).

Usage: ``python benchmarks/bench_linear.py [--check] [--chain] [--ms 1,16,128,8192]
[--nks 7168x18432,...] [--order m|shape] [--weight-order checkpoint|wfrag] [--out FILE]``
(needs a CUDA GPU). JSON goes to ``benchmarks/results/linear_h200.json`` by default; its
``meta`` records the GPU, the versions and the timing method.
"""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from _timing import capture, l2_flush, replay_median_us, time_one_call

import nvfp4_ops
from nvfp4_ops.reference import linear_fp32

BW_TBS = 4.1
PEAK_TFLOPS = 790.0
NKS = [(7168, 18432), (18432, 7168), (4096, 4096), (1536, 4096)]
SINGLE_METHOD = ("one call per CUDA-graph replay, L2 flushed by reading 256 MiB before each "
                 "replay, median of 50 replays")
CHAIN_METHOD = ("throughput: 20 back-to-back calls per CUDA-graph replay (5 at M > 1024), "
                "weight sets rotated, no flush, median of 30 replays / calls")


@dataclass(frozen=True)
class Row:
    m: int
    n: int
    k: int
    nvfp4_us: float
    bf16_us: float
    nvfp4_tbs: float
    bf16_tbs: float
    nvfp4_tflops: float
    bf16_tflops: float
    pct_roofline: float
    speedup: float


def time_graph(make_call, sets: int, reps: int, iters: int) -> float:
    calls = [make_call(i % sets) for i in range(reps)]
    for c in calls[:sets]:
        c()
    torch.cuda.synchronize()
    graph = capture(calls)
    graph.replay()
    torch.cuda.synchronize()
    return replay_median_us(graph, iters, calls_per_replay=reps)


def bench_one(m: int, n: int, k: int, check: bool, wfrag: bool = False,
              flush: Callable[[], object] | None = None) -> Row:
    """One row. ``flush`` (:func:`_timing.l2_flush`): one call per replay with that flush
    before each; None: the chained throughput method (``--chain``)."""
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    fp4_bytes = 0.5625 * n * k
    sets = max(2, min(8, int(200e6 // fp4_bytes) + 1))
    bsets = max(2, min(8, int(200e6 // (2 * n * k)) + 1))
    ws = []
    for _ in range(sets):
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
        s = (torch.rand(n, k // 16, device="cuda", generator=gen) + 0.5).to(torch.float8_e4m3fn)
        ws.append((w, s, torch.rand(n, device="cuda", generator=gen) * 0.01 + 1e-3))
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    if check:
        w, s, g = ws[0]
        ref = linear_fp32(x, w, s, g)
        if wfrag:
            w = nvfp4_ops.to_wfrag_(w.clone())
        out = nvfp4_ops.linear(x, w, s, g, wfrag=wfrag).float()
        err = ((out - ref).norm() / ref.norm()).item()
        assert err < 3e-3, f"check failed at M={m} N={n} K={k}: rel L2 {err}"
    bws = [torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(bsets)]
    outs = [torch.empty(m, n, dtype=torch.bfloat16, device="cuda") for _ in range(2)]

    if wfrag:
        for w, _, _ in ws:
            nvfp4_ops.to_wfrag_(w)

    def make_fp4(i):
        w, s, g = ws[i]
        return lambda: nvfp4_ops.linear(x, w, s, g, wfrag=wfrag)

    def make_bf16(i):
        wt = bws[i % bsets]
        return lambda: torch.matmul(x, wt.t(), out=outs[i % 2])

    if flush is None:
        reps = 20 if m <= 1024 else 5
        t4 = time_graph(make_fp4, sets, reps, 30)
        t16 = time_graph(make_bf16, bsets, reps, 30)
    else:
        t4 = time_one_call(make_fp4(0), 50, flush)
        t16 = time_one_call(make_bf16(0), 50, flush)
    flops = 2.0 * m * n * k
    floor_us = max(fp4_bytes / (BW_TBS * 1e12), flops / (PEAK_TFLOPS * 1e12)) * 1e6
    return Row(
        m, n, k, round(t4, 2), round(t16, 2),
        round(fp4_bytes / t4 / 1e6, 3), round(2 * n * k / t16 / 1e6, 3),
        round(flops / t4 / 1e6, 1), round(flops / t16 / 1e6, 1),
        round(100 * floor_us / t4, 1), round(t16 / t4, 2),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ms", default="1,16,128,1024,8192")
    p.add_argument("--nks", default=",".join(f"{n}x{k}" for n, k in NKS))
    p.add_argument("--check", action="store_true")
    p.add_argument("--out", default=None)
    p.add_argument("--order", choices=("m", "shape"), default="m",
                   help="m: all shapes at the smallest M first; shape: one shape at a time")
    p.add_argument("--weight-order", choices=("checkpoint", "wfrag"), default="wfrag",
                   help="wfrag: weights prepared by nvfp4.to_wfrag_ (what the glue runs)")
    p.add_argument("--chain", action="store_true",
                   help="throughput: 20 back-to-back calls per graph replay, weight sets "
                        "rotated, no flush (default: one call per replay, L2 read-flushed)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_linear: needs a CUDA GPU")
    flush = None if args.chain else l2_flush("read")
    method = (CHAIN_METHOD if args.chain else SINGLE_METHOD)
    print(f"timing: {method}", flush=True)
    ms = [int(v) for v in args.ms.split(",")]
    nks = [tuple(int(v) for v in s.split("x")) for s in args.nks.split(",")]
    if args.order == "m":
        cases = [(m, n, k) for m in sorted(ms) for n, k in nks]
    else:
        cases = [(m, n, k) for n, k in nks for m in ms]
    rows = []
    for m, n, k in cases:
        r = bench_one(m, n, k, args.check, args.weight_order == "wfrag", flush)
        rows.append(r)
        print(f"M={m:5d} N={n:5d} K={k:5d}  nvfp4 {r.nvfp4_us:9.2f} us  bf16 "
              f"{r.bf16_us:9.2f} us  x{r.speedup:5.2f}  {r.nvfp4_tbs:5.2f} TB/s  "
              f"{r.nvfp4_tflops:6.1f} TF/s  roof {r.pct_roofline:5.1f}%", flush=True)
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "order": args.order,
        "weight_order": args.weight_order,
        "method": method,
    }
    for mod in ("triton", "cutlass", "tvm_ffi"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001 - record why
            meta[mod] = f"unavailable: {exc}"
    import importlib.metadata as md

    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
        try:
            meta[dist] = md.version(dist)
        except md.PackageNotFoundError:
            meta[dist] = "not installed as a dist (carried toolchain)"
    out = Path(args.out) if args.out else (
        Path(__file__).parent / "results" / "linear_h200.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    print(f"\n{'M':>5} {'N':>5} {'K':>5} | {'nvfp4 us':>9} {'bf16 us':>9} {'speedup':>7} | "
          f"{'TB/s':>5} {'TF/s':>6} {'%roof':>5}")
    for r in sorted(rows, key=lambda r: (nks.index((r.n, r.k)), r.m)):
        print(f"{r.m:5d} {r.n:5d} {r.k:5d} | {r.nvfp4_us:9.2f} {r.bf16_us:9.2f} "
              f"{r.speedup:7.2f} | {r.nvfp4_tbs:5.2f} {r.nvfp4_tflops:6.1f} {r.pct_roofline:5.1f}")


if __name__ == "__main__":
    main()
