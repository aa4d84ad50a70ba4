"""Benchmark ``nvfp4::moe`` across the matrix users run, against Humming and bf16.

Matrix: shapes V4-Flash (H 4096, I 2048, E 256, top-6) and V4-Pro (H 7168, I 3072, E 384,
top-6); token counts T; routing ``uniform`` or ``skew`` (Zipf: expert popularity
``1 / rank**skew`` over a random permutation of the experts, top-k without replacement per
token); expert-parallel slices ``--ep N`` (one rank of N: E/N local experts starting at
``(N // 2) * E / N``, global ids over all E, the same global routing as EP 1); weight formats
``nvfp4`` and ``mxfp4``. Each cell times, in one process and one run:

* **ours**: ``nvfp4_ops.moe`` (routing, gather, both grouped GEMMs, combine: the whole op),
  with weights as the vLLM glue prepares them: codes in the ``wperm`` bit order
  (:func:`nvfp4_ops.to_wperm_`) where ``dispatch.moe_wperm_supported(H, I)``. MXFP4: prepared
  by ``nvfp4_ops.prepare_mxfp4_moe`` as the glue prepares them: the UE8M0 scales kept in the
  kernels' form with one global scale per expert half (read by the kernels' ``mx`` variants,
  where ``nvfp4_ops.prepare.keeps_mxfp4_scales``), or with ``NVFP4_OPS_MXFP4_SCALES=convert``
  converted to NVFP4 scales with one global scale per row (codes unchanged).
* **Humming** (``humming-kernels`` 0.1.19, what vLLM 0.33 pins and tries first on SM90 for
  NVFP4 and MXFP4 MoE): weights converted as vLLM converts ModelOpt-NVFP4 / MXFP4 expert
  parameters, the MoE run as vLLM's Humming experts run it: the ``indexed`` GEMMs without
  EP, ``grouped_contiguous`` with EP (``--humming-gemm`` overrides), bf16 activations, the
  clamped SwiGLU (``swiglu_limit``) in Humming's input-processing kernel, then a weighted
  top-k sum (one Triton kernel, as vLLM's ``moe_fused_mul_sum`` / ``moe_unpermute``).
  **Asymmetry:** Humming's routing metadata (block-aligned sorted ids, or expert offsets and
  scatter indices) is computed OUTSIDE its timed graph, while ours includes its routing and
  combine; Humming's figures are therefore a lower bound of what its call costs inside vLLM.
* **bf16**: the same MoE with bf16 weights (random, same sizes) and ``torch._grouped_mm``
  (routing by ``argsort``, gather, grouped GEMM 1, clamped SwiGLU, grouped GEMM 2, router
  weight, ``index_add_`` combine), timed in a phase of its own before the others (its V4-Pro
  weights are 51 GB).

Timing: each implementation is captured in a CUDA graph holding ONE call; every timed replay
is preceded by an untimed L2 flush that *reads* 256 MB (a write flush leaves dirty lines whose
write-back is charged to the timed call); a measurement is the median of ``--reps`` replays.
``--order abba`` (default): ours, Humming, Humming again, ours again, each implementation's
figure the mean of its two medians (``<impl>_us_runs`` keeps both). Why: two medians of the
same call in one cell differ, by up to 11 % on an H200 (the same plan measured first and
third, ``benchmarks/results/ab_scale_lead_h200.log``) and by 0.97-1.06x (deciles) on an H100
(``bench_moe_*_h100.json``), so one measurement each in a fixed order can credit a drift of
the GPU's clock to one side; the symmetric order cancels a linear drift. ``--order ab``: one
measurement each, ours first. ``--chained N`` adds a graph of N back-to-back calls per replay:
a throughput figure, labelled "chained", not a latency.

Per cell: ``local_rows`` (slots routed to local experts), ``D`` (touched local experts),
``roofline_us = max(D * 3 H I * b / 4.1 TB/s, 6 * local_rows * H I / 790 TFLOP/s)`` with
``b`` = 0.5625 bytes per weight (NVFP4) or 0.53125 (MXFP4); for each implementation µs and %
of that roofline; speed-ups ``vs H`` = t_Humming / t_ours and ``vs bf16`` = t_bf16 / t_ours
(> 1: ours faster); MXFP4 rows also ``vs NVFP4`` = t_ours_NVFP4 / t_ours_MXFP4 (same cell).
``--check`` compares ours with the reference at small T, and Humming with ours in every cell
(relative L2), so a wrong adapter cannot pass silently.

Output: progress lines as it goes; ``benchmarks/results/bench_moe_<format>_<shape>.json``
rewritten after every cell (GPU name, versions, the command line, git commit, every cell,
every skip and error); a table per shape / routing / EP / format and a PNG per shape and
format (µs vs T, log-log) at the end. A failing implementation or cell prints one line and the
run goes on; ``--time-limit`` stops starting cells (the rest are listed as not run).

``--stages`` (NVFP4, a diagnostic): ours' routing, gather, GEMM 1, GEMM 2 and combine, each
in a graph of its own (cold L2 each, no launch overlap), built from the op's internal pieces
(``dispatch.plan_moe``, ``triton.moe_routing``, ``linear_cuda.run_gemm`` and its global-scale
views, ``triton.moe_combine``); their sum against the whole op shows the gaps.

``--ranks 2``: one process per GPU (NCCL; NVLink multicast off in every process), rank r owns
experts ``[r E/2, (r+1) E/2)``; per-rank device time of the local MoE vs the single-GPU op at
the same T, and the all-reduce of the ``[T, H]`` bf16 output timed separately
(``bench_moe_ranks2.json``).

CPU: ``--help``, ``--dry-run`` (the plan and its time estimate) and ``--fake-timings`` (the
reporting path with timings from the estimate model, files marked fake) need no GPU; without
CUDA the script says so and exits 0. Exit status 3: a ``--check`` failed.

Run from the repository root::

    python benchmarks/bench_moe.py --dry-run                  # the plan, its estimated time
    python benchmarks/bench_moe.py --shapes v4-flash --format nvfp4 mxfp4 --check
    python benchmarks/bench_moe.py --shapes v4-pro --ep 8 --routing skew --tokens 512 4096
    python benchmarks/bench_moe.py --ranks 2                  # two GPUs

Humming needs ``humming-kernels==0.1.19`` importable (it JIT-compiles its kernels with NVRTC
from the CUDA toolkit's headers on first use, into ``~/.humming/cache``); without it the
Humming columns are skipped with one line.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from _moe_peers import Bf16GroupedMoE, HummingMoE, humming_gemm_type, humming_modules
from _moe_report import Cell, Report, num
from _timing import git_commit, l2_flush, time_chained, time_one_call

import nvfp4_ops
from nvfp4_ops.shapes import MoEShape, get_shape
from nvfp4_ops.testing import (
    MXFP4_BYTES_PER_WEIGHT,
    NVFP4_BYTES_PER_WEIGHT,
    cell_routing,
    ep_slice,
    fast_random_experts,
    fast_random_mxfp4_experts,
    moe_cost,
    rel_l2,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
HBM_TBPS = 4.1
PEAK_TFLOPS = 790.0
SHAPES = ("v4-flash", "v4-pro")
TOKENS = (1, 8, 32, 128, 512, 2048, 4096, 16384)
RANKS_TOKENS = (1, 8, 128, 512, 4096)
ROUTINGS = ("uniform", "skew")
EPS = (1, 8)
FORMATS = ("nvfp4", "mxfp4")
PEERS = ("humming", "bf16")
BYTES_PER_WEIGHT = {"nvfp4": NVFP4_BYTES_PER_WEIGHT, "mxfp4": MXFP4_BYTES_PER_WEIGHT}
#: relative L2 bounds of --check: ours vs the reference (per-slot bf16 rounding before the
#: fp32 combine gives ~2.5e-3, as in tests/test_moe_gpu.py); Humming vs ours (Humming also
#: rounds gate/up to bf16 before the activation: a few 1e-3 expected; a wrong layout, scale or
#: gate/up order gives O(1))
CHECK_REF_REL_L2 = 4e-3
CHECK_PEER_REL_L2 = 2e-2




def log(msg: str) -> None:
    print(msg, flush=True)


# --- the plan and its time estimate -----------------------------------------------------------

def build_plan(args: argparse.Namespace) -> list[Cell]:
    """Cells in run order: shape, format, EP, routing, T (T ascending).

    Raises:
        ValueError: an EP degree that does not divide a shape's experts.
    """
    cells = []
    for name in dict.fromkeys(args.shapes):
        shape = get_shape(name)
        for ep in dict.fromkeys(args.ep):
            ep_slice(shape.experts, ep)  # raises for a bad split
        for fmt in dict.fromkeys(args.format):
            for ep in dict.fromkeys(args.ep):
                for routing in dict.fromkeys(args.routing):
                    for num_tokens in sorted(set(args.tokens)):
                        cells.append(Cell(name, fmt, ep, routing, num_tokens))
    return cells


def expected_cost(shape: MoEShape, fmt: str, ep: int, num_tokens: int
                  ) -> tuple[float, float, float]:
    """Expected ``(local_rows, bytes_us, flops_us)`` of a cell under uniform routing (for the
    estimate only; the cells report the real counts): the weight stream of the touched local
    experts at 4.1 TB/s, the FLOPs of the local rows at 790 TFLOP/s."""
    local = shape.experts // ep
    touched = local * (1 - (1 - shape.top_k / shape.experts) ** num_tokens)
    rows = num_tokens * shape.top_k / ep
    nbytes = touched * 3 * shape.hidden * shape.intermediate * BYTES_PER_WEIGHT[fmt]
    flops = 6.0 * rows * shape.hidden * shape.intermediate
    return rows, nbytes / (HBM_TBPS * 1e6), flops / (PEAK_TFLOPS * 1e6)


def estimate_call_us(impl: str, shape: MoEShape, fmt: str, ep: int, num_tokens: int) -> float:
    """A rough per-call time model (µs), calibrated on H200 figures of V4-Flash / V4-Pro under
    uniform routing: ours and Humming at ~2x their roofline; bf16 at ~1.7x its weight stream
    (2 bytes per weight) or ~2.2x the FLOP floor."""
    _, bytes_us, flops_us = expected_cost(shape, fmt, ep, num_tokens)
    roof = max(bytes_us, flops_us)
    if impl == "ours":
        return 2.0 * roof + 12.0
    if impl == "humming":
        return 2.2 * roof + 18.0
    return max(1.7 * bytes_us * 2.0 / BYTES_PER_WEIGHT[fmt], 2.2 * flops_us) + 40.0


def estimate(plan: list[Cell], args: argparse.Namespace) -> dict[str, float]:
    """Seconds the plan should take on an H200 (rough): process start, kernel compiles,
    weights, and per timed implementation ``(reps + warm + 2)`` calls plus ~0.15 ms per replay
    (flush, events, host) and ~60 ms of capture and inputs."""
    if not plan:
        return {"setup_s": 0.0, "timing_s": 0.0, "total_s": 0.0}
    shapes = list(dict.fromkeys(c.shape for c in plan))
    setup = 20.0 + (30.0 + 25.0 * len(shapes) if args.jobs > 0 else 70.0 * len(shapes))
    timing = 0.0
    for name in shapes:
        shape = get_shape(name)
        cells = [c for c in plan if c.shape == name]
        quant_gb = shape.experts * 3 * shape.hidden * shape.intermediate * 0.5625 / 1e9
        for _ in dict.fromkeys(c.fmt for c in cells):
            setup += 1.0 + quant_gb / 20.0  # random codes + our preparation
            if "humming" in args.peers:
                setup += 20.0 + 2 * quant_gb / 10.0  # its kernel compiles, its weight transform
        if "bf16" in args.peers:
            setup += 2.0 + quant_gb * 2 / 0.5625 / 40.0
    calls = args.reps + args.warm_reps + 2
    impls = ["ours"] + [p for p in args.peers if p == "humming"]
    if args.order == "abba" and len(impls) == 2:
        impls = impls * 2  # ours, Humming, Humming, ours
    bf16_keys = set()
    for c in plan:
        shape = get_shape(c.shape)
        for impl in impls:
            t_us = estimate_call_us(impl, shape, c.fmt, c.ep, c.tokens)
            timing += calls * (t_us + 150.0) * 1e-6 + 0.06
            if args.chained:
                timing += args.reps * args.chained * t_us * 1e-6
            if args.stages and impl == "ours" and c.fmt == "nvfp4":
                timing += 5 * (calls * (t_us / 3 + 150.0) * 1e-6 + 0.06)
        if "bf16" in args.peers and (c.shape, c.ep, c.routing, c.tokens) not in bf16_keys:
            bf16_keys.add((c.shape, c.ep, c.routing, c.tokens))
            timing += calls * (estimate_call_us("bf16", shape, c.fmt, c.ep, c.tokens)
                               + 150.0) * 1e-6 + 0.06
    if args.check:
        timing += 4.0 * len({(c.shape, c.fmt, c.ep) for c in plan})
    return {"setup_s": setup, "timing_s": timing, "total_s": setup + timing}


def describe_plan(plan: list[Cell], args: argparse.Namespace) -> str:
    est = estimate(plan, args)
    dims = (f"{len(dict.fromkeys(c.shape for c in plan))} shape(s) x "
            f"{len(dict.fromkeys(c.fmt for c in plan))} format(s) x "
            f"{len(dict.fromkeys(c.ep for c in plan))} EP x "
            f"{len(dict.fromkeys(c.routing for c in plan))} routing(s) x "
            f"{len(dict.fromkeys(c.tokens for c in plan))} T")
    lines = [f"plan: {dims} = {len(plan)} cells; implementations: "
             f"{', '.join(['ours', *args.peers])}; reps {args.reps}"
             + (f"; chained x{args.chained}" if args.chained else "")
             + ("; --check" if args.check else "") + ("; --stages" if args.stages else ""),
             f"estimated time (rough, H200): {est['total_s'] / 60:.1f} min "
             f"(setup {est['setup_s']:.0f} s, timing {est['timing_s']:.0f} s)"]
    if est["total_s"] > 480:
        lines.append("  more than one ~8-minute device call: split it with --shapes / --format "
                     "/ --ep / --routing, or bound it with --time-limit")
    return "\n".join(lines)


# --- results: rows, JSON, tables, plots --------------------------------------------------------

def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "torch": torch.__version__,
           "cuda": torch.version.cuda or "none"}
    for dist in ("triton", "nvidia-cutlass-dsl", "apache-tvm-ffi", "humming-kernels"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def run_meta(args: argparse.Namespace, fake: bool) -> dict:
    try:
        from nvfp4_ops import _compile

        fingerprint = _compile.fingerprint()
    except Exception as exc:  # noqa: BLE001 - metadata only
        fingerprint = f"unavailable ({type(exc).__name__})"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return {
        "gpu": "FAKE (timings from the estimate model, no GPU)" if fake else gpu,
        "fake": fake,
        "versions": versions(),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "commit": git_commit(),
        "source_fingerprint": fingerprint,
        "utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "method": "one op call per CUDA-graph replay; before each replay L2 is flushed by "
                  "reading 256 MB; median of reps; every implementation in one process; "
                  + ("per cell ours, Humming, Humming, ours, each the mean of its two medians"
                     if args.order == "abba" else "per cell ours, then Humming"),
        "order": args.order,
        "reps": args.reps, "warm_reps": args.warm_reps, "chained": args.chained,
        "skew": args.skew, "seed": args.seed, "humming_gemm": args.humming_gemm,
        "humming_fallback": args.humming_fallback,
        "roofline": {"hbm_tbps": HBM_TBPS, "peak_tflops": PEAK_TFLOPS,
                     "bytes_per_weight": BYTES_PER_WEIGHT},
        "asymmetry": "Humming's routing metadata is precomputed outside its timed graph; "
                     "ours includes routing and combine",
    }


# --- fake timings (CPU: the reporting path without a GPU) ------------------------------------

def run_fake(plan: list[Cell], args: argparse.Namespace, report: Report) -> None:
    """Fill the report from the estimate model on the real routing of every cell (counts and
    rooflines are real; the µs are not)."""
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    for i, cell in enumerate(plan):
        if deadline is not None and time.monotonic() > deadline:
            report.note(cell.fmt, cell.shape, f"not run (--time-limit {args.time_limit:g} s): "
                                              f"{cell.shape} {cell.fmt} {cell.key}")
            continue
        shape = get_shape(cell.shape)
        ids, _ = routing_for(shape, cell.routing, cell.tokens, args)
        fields = cost_fields(shape, cell, ids)
        fields["ours_us"] = estimate_call_us("ours", shape, cell.fmt, cell.ep, cell.tokens)
        for peer in args.peers:
            fields[f"{peer}_us"] = estimate_call_us(peer, shape, cell.fmt, cell.ep, cell.tokens)
        if args.chained:
            fields["ours_chained_us"] = 0.9 * fields["ours_us"]
        if "humming" in args.peers:
            fields["humming_gemm"] = humming_gemm_type(args.humming_gemm, cell.ep)
        report.set(cell, **fields)
        log(f"[{i + 1}/{len(plan)}] {cell.shape} {cell.fmt} {cell.key}: fake")


def routing_for(shape: MoEShape, routing: str, num_tokens: int,
                args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """The cell's global routing (CPU, reproducible: the same for every EP degree, format and
    run with this seed)."""
    return cell_routing(routing, num_tokens, shape.experts, shape.top_k, skew=args.skew,
                        seed=args.seed)


def cost_fields(shape: MoEShape, cell: Cell, ids: torch.Tensor) -> dict:
    start, local = ep_slice(shape.experts, cell.ep)
    cost = moe_cost(ids, shape.hidden, shape.intermediate, expert_start=start,
                    local_experts=local, bytes_per_weight=BYTES_PER_WEIGHT[cell.fmt],
                    hbm_tbps=HBM_TBPS, peak_tflops=PEAK_TFLOPS)
    from nvfp4_ops.kernels import dispatch

    plan = dispatch.plan_moe(cell.tokens, shape.top_k, local, shape.hidden, shape.intermediate,
                             global_num_experts=shape.experts) if cell.tokens else None
    return {"local_rows": cost.local_rows, "touched_experts": cost.touched_experts,
            "bytes": cost.bytes, "flops": cost.flops, "roofline_us": cost.roofline_us,
            "ours_block_m": None if plan is None else plan.block_m,
            "ours_hot_block_m": None if plan is None or plan.hot is None
            else plan.hot.routing.block_m}


def wperm_supported(hidden: int, inter: int) -> bool:
    """Whether the MoE kernels read ``wperm`` weights at these sizes (the vLLM glue's test)."""
    from nvfp4_ops.kernels import dispatch

    return dispatch.moe_wperm_supported(hidden, inter)


def precompile(shapes: list[str], jobs: int) -> None:
    """Compile every CuTeDSL variant the shapes reach in ``jobs`` worker processes, into the
    disk cache (``python -m nvfp4_ops precompile``'s parallel pass), so that
    :func:`nvfp4_ops.warmup` only loads them; on failure warmup compiles them instead."""
    t0 = time.monotonic()
    try:
        from nvfp4_ops.cli.precompile import _compile_parallel

        log(f"precompiling the kernel variants of {', '.join(shapes)} with {jobs} workers")
        n = _compile_parallel(list(shapes), True, jobs)
        log(f"precompile: {n} compiled in {time.monotonic() - t0:.1f} s")
    except Exception as exc:  # noqa: BLE001 - warmup compiles what is missing
        log(f"precompile failed ({type(exc).__name__}: {exc}); warmup compiles instead")


def _expert_views(tensors: dict[str, torch.Tensor], start: int, count: int) -> dict:
    return {k: v[start:start + count] for k, v in tensors.items()}


def _nvfp4_tensors(q) -> dict[str, torch.Tensor]:
    return {"w13": q.w13, "w13_scale": q.w13_scale, "w13_global": q.w13_global, "w2": q.w2,
            "w2_scale": q.w2_scale, "w2_global": q.w2_global}


def _mxfp4_tensors(m) -> dict[str, torch.Tensor]:
    return {"w13": m.w13, "w13_scale": m.w13_scale, "w2": m.w2, "w2_scale": m.w2_scale}


def stage_callables(shape: MoEShape, t: dict, wperm: bool, start: int, local: int,
                    hidden, ids, weights) -> dict[str, Callable]:
    """``--stages`` (NVFP4): the op's stages for its own plan, each a zero-argument callable
    built as ``moe_cuda.moe_forward`` builds them, from ``dispatch.plan_moe``,
    ``triton.moe_routing.moe_routing`` / ``gather_rows``, ``linear_cuda.run_gemm`` (with
    ``gate_up_global_view`` / ``per_group_global_view``) and ``triton.moe_combine.combine``,
    launched without launch overlap: internals, a diagnostic only."""
    from nvfp4_ops.kernels import dispatch, linear_cuda
    from nvfp4_ops.kernels.triton import moe_combine, moe_routing

    num_tokens, top_k = ids.shape
    h, i = shape.hidden, shape.intermediate
    order = dispatch.WeightOrder.WPERM if wperm else dispatch.WeightOrder.CHECKPOINT
    # one token tile for all experts (hot=False): the stages of a two-tile call are the same
    # kernels launched twice
    plan = dispatch.plan_moe(num_tokens, top_k, local, h, i, global_num_experts=shape.experts,
                             order=order, chained=False, hot=False)
    routing = moe_routing.moe_routing(ids, local, start, plan.block_m)
    a, row_scale = moe_routing.gather_rows(hidden, weights, routing, plan.act_order)
    act = torch.empty(plan.num_rows, i, dtype=torch.bfloat16, device=a.device)
    y = torch.empty(plan.num_rows, h, dtype=torch.bfloat16, device=a.device)
    g13 = linear_cuda.gate_up_global_view(t["w13_global"], i)
    g2 = linear_cuda.per_group_global_view(t["w2_global"], h)
    tiles = {"tile_expert": routing.tile_expert, "tile_rows": routing.tile_rows}
    return {
        "routing": lambda: moe_routing.moe_routing(ids, local, start, plan.block_m),
        "gather": lambda: moe_routing.gather_rows(hidden, weights, routing, plan.act_order),
        "gemm1": lambda: linear_cuda.run_gemm(plan.gate_up, a, t["w13"], t["w13_scale"], g13,
                                              act, row_scale=None,
                                              swiglu_limit=shape.swiglu_limit, **tiles),
        "gemm2": lambda: linear_cuda.run_gemm(plan.down, act, t["w2"], t["w2_scale"], g2, y,
                                              row_scale=row_scale, swiglu_limit=None, **tiles),
        "combine": lambda: moe_combine.combine(y, routing.slot_row, num_tokens, top_k, 1.0),
    }


class GPUBench:
    """Runs the plan on the GPU, shape by shape: the bf16 baseline over the shape's cells, then
    for each format ours and Humming cell by cell (interleaved); each phase frees its weights."""

    def __init__(self, plan: list[Cell], args: argparse.Namespace, report: Report) -> None:
        self.plan = plan
        self.args = args
        self.report = report
        self.device = "cuda"
        self.flush = l2_flush("read", device=self.device)
        self.deadline = time.monotonic() + args.time_limit if args.time_limit else None
        self.done = 0
        self._inputs: dict[tuple, tuple] = {}
        self.humming = "humming" in args.peers and humming_modules() is not None

    # helpers ---------------------------------------------------------------------------------
    def out_of_time(self, cell: Cell) -> bool:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.report.note(cell.fmt, cell.shape, f"not run (--time-limit "
                             f"{self.args.time_limit:g} s): {cell.shape} {cell.fmt} {cell.key}")
            return True
        return False

    def measure(self, fn: Callable, keep: bool, chain: bool = True
                ) -> tuple[float | None, float | None, object]:
        """``(µs, chained µs or None, eager output (``keep``) or the error line)``; never
        raises."""
        try:
            out = fn()
            torch.cuda.synchronize()
            out = out.clone() if keep else None
            us = time_one_call(fn, self.args.reps, self.flush, warmup=self.args.warm_reps)
            chained = None
            if self.args.chained and chain:
                chained = time_chained(fn, self.args.chained, self.args.reps, self.flush)
            return us, chained, out
        except Exception as exc:  # noqa: BLE001 - fail soft: one line, the run goes on
            msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
            return None, None, msg[:300]

    def inputs(self, shape: MoEShape, routing: str, num_tokens: int):
        key = (shape.name, routing, num_tokens)
        if key not in self._inputs:
            ids, weights = routing_for(shape, routing, num_tokens, self.args)
            gen = torch.Generator(device=self.device).manual_seed(self.args.seed * 7 + num_tokens)
            hidden = torch.randn(num_tokens, shape.hidden, device=self.device,
                                 generator=gen).to(torch.bfloat16)
            self._inputs[key] = (hidden, ids.to(self.device), weights.to(self.device), ids)
        return self._inputs[key]

    # the run ---------------------------------------------------------------------------------
    def run(self) -> None:
        shapes = list(dict.fromkeys(c.shape for c in self.plan))
        if self.args.jobs > 0:
            precompile(shapes, self.args.jobs)
        for name in shapes:
            self._inputs = {}
            try:
                self.run_shape(get_shape(name), [c for c in self.plan if c.shape == name])
            except Exception:  # noqa: BLE001 - the next shape may still run
                self.report.note(None, name, f"{name}: FAILED, its remaining cells skipped:\n"
                                 + traceback.format_exc())
            self._inputs = {}
            gc.collect()
            torch.cuda.empty_cache()

    def run_shape(self, shape: MoEShape, cells: list[Cell]) -> None:
        t0 = time.monotonic()
        nvfp4_ops.warmup([shape.name])  # compile (or load) and run every variant once
        log(f"{shape.name}: warmup {time.monotonic() - t0:.1f} s; nvfp4::moe runs "
            f"{nvfp4_ops.kernels.describe('moe', self.device)}")
        if "bf16" in self.args.peers:  # first: a --time-limit cuts the formats' cells instead
            try:
                self.run_bf16(shape, cells)
            except Exception:  # noqa: BLE001
                self.report.note(None, shape.name, f"{shape.name} bf16: FAILED:\n"
                                 + traceback.format_exc())
            gc.collect()
            torch.cuda.empty_cache()
        for fmt in dict.fromkeys(c.fmt for c in cells):
            try:
                self.run_format(shape, fmt, [c for c in cells if c.fmt == fmt])
            except Exception:  # noqa: BLE001
                self.report.note(fmt, shape.name, f"{shape.name} {fmt}: FAILED, its remaining "
                                 "cells skipped:\n" + traceback.format_exc())
            gc.collect()
            torch.cuda.empty_cache()

    def slices(self, shape: MoEShape, cells: list[Cell]) -> dict[int, tuple[int, int]]:
        return {ep: ep_slice(shape.experts, ep) for ep in dict.fromkeys(c.ep for c in cells)}

    def make_weights(self, shape: MoEShape, fmt: str, slices: dict) -> tuple[list, dict]:
        """Checkpoint-order weights: all experts when EP 1 is planned (the slices are views),
        else each slice's own experts (the same bytes as in the full set)."""
        h, i, e = shape.hidden, shape.intermediate, shape.experts
        kw = {"device": self.device, "seed": self.args.seed}

        def make(count, first):
            if fmt == "nvfp4":
                # equal gate / up global scales, as ModelOpt's exports have them (HummingMoE)
                return _nvfp4_tensors(fast_random_experts(count, h, i, first_expert=first,
                                                          shared_gate_up_global=True, **kw))
            return _mxfp4_tensors(fast_random_mxfp4_experts(count, h, i, first_expert=first,
                                                            **kw))

        if 1 in slices:
            full = make(e, 0)
            return [full], {ep: _expert_views(full, s, n) for ep, (s, n) in slices.items()}
        views = {ep: make(n, s) for ep, (s, n) in slices.items()}
        return list(views.values()), views

    def run_format(self, shape: MoEShape, fmt: str, cells: list[Cell]) -> None:
        t0 = time.monotonic()
        slices = self.slices(shape, cells)
        bases, views = self.make_weights(shape, fmt, slices)
        torch.cuda.synchronize()
        log(f"{shape.name} {fmt}: random weights in {time.monotonic() - t0:.1f} s")
        humming = {}
        if self.humming:  # from the checkpoint-order codes, before ours permutes them
            for ep, (start, local) in slices.items():
                gemm = humming_gemm_type(self.args.humming_gemm, ep)
                # --humming-fallback: vLLM's grouped path built beside its indexed one (EP 1),
                # timed instead should indexed fail in this harness (noted in the table). Off
                # by default: a second copy of Humming's weights and ~12 s per shape and
                # format, and indexed has not failed in any committed run
                kinds = [gemm] + (["grouped_contiguous"]
                                  if self.args.humming_fallback and gemm == "indexed" else [])
                built = []
                for kind in kinds:
                    t1 = time.monotonic()
                    try:
                        built.append(HummingMoE(
                            shape, fmt, views[ep], expert_start=start, local_experts=local,
                            gemm_type=kind,
                            token_counts=[c.tokens for c in cells if c.ep == ep],
                            device=self.device))
                        torch.cuda.synchronize()
                        log(f"{shape.name} {fmt} EP {ep}: Humming weights ({kind}) in "
                            f"{time.monotonic() - t1:.1f} s; {built[-1].describe()}")
                    except Exception as exc:  # noqa: BLE001
                        self.report.note(fmt, shape.name, f"{shape.name} {fmt} EP {ep}: "
                                         f"Humming ({kind}) skipped: {type(exc).__name__}: "
                                         f"{exc}")
                if built:
                    humming[ep] = built[0]
                    humming[ep].fallback = built[1] if len(built) > 1 else None
        ours, reason = self.prepare_ours(shape, fmt, bases, views, slices)
        if reason:
            self.report.note(fmt, shape.name, f"{shape.name} {fmt}: ours skipped: {reason}")
        del bases
        if self.args.check and ours:
            self.check_reference(shape, fmt, ours, cells)
        for cell in cells:
            if self.out_of_time(cell):
                continue
            h = humming.get(cell.ep)
            self.run_cell(shape, cell, ours.get(cell.ep), h)
            if h is not None and h.disabled and getattr(h, "fallback", None) is not None:
                self.report.note(fmt, shape.name, f"{shape.name} {fmt} EP {cell.ep}: Humming's "
                                 f"{h.gemm_type} path failed ({h.disabled}); its "
                                 f"{h.fallback.gemm_type} path is timed instead")
                humming[cell.ep] = h.fallback
                self.run_cell(shape, cell, ours.get(cell.ep), h.fallback)  # this cell again
        del ours, humming, views

    def prepare_ours(self, shape: MoEShape, fmt: str, bases: list, views: dict, slices: dict
                     ) -> tuple[dict, str | None]:
        """Ours per EP slice: ``(ep -> (call, tensors, wperm))``, or ``({}, why not)``."""
        h, i = shape.hidden, shape.intermediate
        wperm = wperm_supported(h, i)
        form = ""
        if fmt == "mxfp4":
            # the kernels' UE8M0 form where the glue would keep it, else NVFP4 scales
            from nvfp4_ops.prepare import keeps_mxfp4_scales

            native = keeps_mxfp4_scales(h, i, cuda=True)
            form = (", UE8M0 scales read natively" if native
                    else ", scales converted to NVFP4's")
            for base in bases:  # as the glue prepares them; the codes are permuted below
                s13, g13, s2, g2, _ = nvfp4_ops.prepare_mxfp4_moe(
                    base["w13"], base.pop("w13_scale"), base["w2"], base.pop("w2_scale"),
                    wperm=False, native=native)
                base.update(w13_scale=s13, w13_global=g13, w2_scale=s2, w2_global=g2)
            form += (", one global scale per expert half" if bases[0]["w2_global"].dim() == 1
                     else ", one global scale per row")
            if 1 in slices:
                views = {ep: _expert_views(bases[0], s, n) for ep, (s, n) in slices.items()}
            else:
                views = dict(zip(slices, bases, strict=True))
        if wperm:
            for base in bases:
                nvfp4_ops.to_wperm_(base["w13"])
                nvfp4_ops.to_wperm_(base["w2"])
        out = {}
        for ep, (start, _) in slices.items():
            t = views[ep]

            def call(hidden, ids, weights, t=t, start=start):
                return nvfp4_ops.moe(hidden, ids, weights, t["w13"], t["w13_scale"],
                                     t["w13_global"], t["w2"], t["w2_scale"], t["w2_global"],
                                     expert_start=start, global_num_experts=shape.experts,
                                     swiglu_limit=shape.swiglu_limit, output_scale=1.0,
                                     wperm=wperm)

            out[ep] = (call, t, wperm)
        if fmt == "mxfp4":  # does this tree's op take the form its preparation made?
            hidden, ids, weights, _ = self.inputs(shape, "uniform", 1)
            try:
                next(iter(out.values()))[0](hidden, ids, weights)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001
                return {}, (f"nvfp4.moe refused the prepared MXFP4 form: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}")
        log(f"{shape.name} {fmt}: ours ready (codes in the {'wperm' if wperm else 'checkpoint'} "
            f"bit order{form})")
        if form:
            self.report.note(fmt, shape.name, f"{shape.name} {fmt}: ours{form}")
        return out, None

    def check_reference(self, shape: MoEShape, fmt: str, ours: dict, cells: list[Cell]) -> None:
        from nvfp4_ops.reference import moe_reference

        planned = sorted({c.tokens for c in cells})
        tokens = sorted({t for t in (1, 128) if t in planned} or {planned[0]})
        for ep, (call, t, wperm) in ours.items():
            start = ep_slice(shape.experts, ep)[0]
            for num_tokens in tokens:
                hidden, ids, weights, _ = self.inputs(shape, "uniform", num_tokens)
                try:
                    got = call(hidden, ids, weights)
                    want = moe_reference(hidden, ids, weights, t["w13"], t["w13_scale"],
                                         t["w13_global"], t["w2"], t["w2_scale"], t["w2_global"],
                                         start, shape.swiglu_limit, 1.0, wperm=wperm)
                    err = rel_l2(got, want)
                    ok = err < CHECK_REF_REL_L2 and not bool(got.isnan().any())
                except Exception as exc:  # noqa: BLE001
                    self.report.note(fmt, shape.name, f"check {shape.name} {fmt} EP {ep} "
                                     f"T={num_tokens}: reference unavailable: "
                                     f"{type(exc).__name__}: {exc}")
                    continue
                self.report.check_failed |= not ok
                self.report.note(fmt, shape.name, f"check {shape.name} {fmt} EP {ep} "
                                 f"T={num_tokens}: ours vs reference rel_l2 {err:.2e} "
                                 f"{'ok' if ok else 'FAILED'}")

    def run_cell(self, shape: MoEShape, cell: Cell, ours, humming: HummingMoE | None) -> None:
        hidden, ids, weights, ids_cpu = self.inputs(shape, cell.routing, cell.tokens)
        fields = cost_fields(shape, cell, ids_cpu)
        errors = {}
        keep = self.args.check
        parts = []
        ours_out = None
        if ours is not None:
            call, t, wperm = ours
            us, chained, ours_out = self.measure(lambda: call(hidden, ids, weights), keep)
            if us is None:
                errors["ours"] = ours_out
                ours_out = None
            else:
                fields.update(ours_us=us, ours_chained_us=chained)
                parts.append(f"ours {us:.1f} us ({100 * fields['roofline_us'] / us:.0f}% roof)")
            if self.args.stages and cell.fmt == "nvfp4":
                fields["stages_us"] = self.stages(shape, cell, t, wperm, hidden, ids, weights)
        if humming is not None and humming.disabled:
            errors["humming"] = f"skipped after two failures ({humming.disabled})"
        elif humming is not None:
            fields["humming_gemm"] = humming.gemm_type
            try:
                meta = humming.prepare(ids)
                t_first = time.monotonic()
                us, chained, h_out = self.measure(lambda: humming(hidden, weights, meta), keep)
                first = time.monotonic() - t_first
            except Exception as exc:  # noqa: BLE001
                us, h_out, first = None, f"{type(exc).__name__}: {exc}", 0.0
            if us is None:
                errors["humming"] = h_out
                humming.failures += 1
                limit = 1 if getattr(humming, "fallback", None) is not None else 2
                if not humming.succeeded and humming.failures >= limit:
                    humming.disabled = h_out  # it never ran: stop paying for its attempts
                    self.report.note(cell.fmt, cell.shape, f"{cell.shape} {cell.fmt} EP "
                                     f"{cell.ep}: Humming failed on its first two cells, "
                                     f"skipped for the rest: {h_out}")
            else:
                humming.succeeded = True
                if self.args.order == "abba" and fields.get("ours_us") is not None:
                    # the second half of ours, Humming, Humming, ours (module docstring)
                    us2, _, _ = self.measure(lambda: humming(hidden, weights, meta), False,
                                             chain=False)
                    ours2, _, _ = self.measure(lambda: call(hidden, ids, weights), False,
                                               chain=False)
                    if us2 is not None and ours2 is not None:
                        fields.update(humming_us_runs=[us, us2],
                                      ours_us_runs=[fields["ours_us"], ours2],
                                      ours_us=0.5 * (fields["ours_us"] + ours2))
                        mean = fields["ours_us"]
                        parts[0] = (f"ours {mean:.1f} us "
                                    f"({100 * fields['roofline_us'] / mean:.0f}% roof; runs "
                                    f"{fields['ours_us_runs'][0]:.1f}, {ours2:.1f})")
                        us = 0.5 * (us + us2)
                fields.update(humming_us=us, humming_chained_us=chained)
                ratio = (f" (vs H {us / fields['ours_us']:.2f}x)" if fields.get("ours_us")
                         else "")
                runs = fields.get("humming_us_runs")
                parts.append(f"Humming {us:.1f} us{ratio}"
                             + (f" (runs {runs[0]:.1f}, {runs[1]:.1f})" if runs else "")
                             + (f" [first call {first:.0f} s]" if first > 5 else ""))
                if keep and ours_out is not None:
                    err = rel_l2(h_out, ours_out)
                    ok = err < CHECK_PEER_REL_L2 and not bool(h_out.isnan().any())
                    fields.update(check_humming_rel_l2=err, check_ok=ok)
                    parts.append(f"check rel_l2 {err:.1e} {'ok' if ok else 'FAILED'}")
        self.report.set(cell, errors=errors, **fields)
        self.done += 1
        err_txt = "".join(f" | {k} FAILED: {v}" for k, v in errors.items())
        log(f"[{self.done}/{len(self.plan)}] {cell.shape} {cell.fmt} {cell.key}: "
            + " | ".join(parts) + err_txt)

    def stages(self, shape, cell, t, wperm, hidden, ids, weights) -> dict | str:
        start, local = ep_slice(shape.experts, cell.ep)
        try:
            fns = stage_callables(shape, t, wperm, start, local, hidden, ids, weights)
            out = {}
            for name, fn in fns.items():
                us, _, err = self.measure(fn, False, chain=False)
                out[name] = us if us is not None else err
            log("  stages (each its own graph, cold L2): " + ", ".join(
                f"{k} {v:.1f}" if isinstance(v, float) else f"{k} FAILED {v}"
                for k, v in out.items()))
            return out
        except Exception as exc:  # noqa: BLE001
            return f"stages unavailable: {type(exc).__name__}: {exc}"

    def run_bf16(self, shape: MoEShape, cells: list[Cell]) -> None:
        t0 = time.monotonic()
        slices = self.slices(shape, cells)
        if 1 in slices:
            full = Bf16GroupedMoE(shape, shape.experts, 0, self.device, self.args.seed)
            base = {ep: full.slice(shape, s, n) for ep, (s, n) in slices.items()}
        else:
            base = {ep: Bf16GroupedMoE(shape, n, s, self.device, self.args.seed + ep)
                    for ep, (s, n) in slices.items()}
        torch.cuda.synchronize()
        log(f"{shape.name}: bf16 weights in {time.monotonic() - t0:.1f} s")
        seen = {}
        for cell in cells:
            key = (cell.ep, cell.routing, cell.tokens)
            if key not in seen:
                if self.out_of_time(cell):
                    continue
                hidden, ids, weights, _ = self.inputs(shape, cell.routing, cell.tokens)
                model = base[cell.ep]
                us, _, err = self.measure(
                    lambda m=model, x=hidden, i=ids, w=weights: m(x, i, w), False, chain=False)
                seen[key] = (us, err)
                log(f"  bf16 {shape.name} {cell.key}: "
                    + (f"{us:.1f} us" if us is not None else f"FAILED: {err}"))
            us, err = seen[key]
            if us is not None:
                self.report.set(cell, bf16_us=us)
            else:
                self.report.set(cell, errors={"bf16": err})
        del base


# --- --ranks N: expert parallelism over N GPUs ----------------------------------------------

def run_ranks(args: argparse.Namespace) -> int:
    world = args.ranks
    tokens = sorted(set(args.tokens)) if args.tokens_given else list(RANKS_TOKENS)
    log(f"plan (--ranks {world}): {', '.join(args.shapes)} x T {tokens}: per-rank local MoE "
        f"(E/{world} experts), the single-GPU op, the all-reduce; reps {args.reps}")
    est = 25.0 + (30 + 25 * len(args.shapes)) + len(args.shapes) * len(tokens) * 3 * (
        args.reps + 4) * 0.01
    log(f"estimated time (rough): {est / 60:.1f} min")
    if args.dry_run:
        return 0
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < world:
        log(f"bench_moe --ranks {world}: needs {world} CUDA devices, found {count}; nothing "
            "measured")
        return 0
    from nvfp4_ops.testing import MULTICAST_OFF

    os.environ.update(MULTICAST_OFF)  # the children inherit it (and set it again)
    import tempfile

    import torch.multiprocessing as mp

    cfg = {"shapes": list(args.shapes), "tokens": tokens, "reps": args.reps,
           "warm_reps": args.warm_reps, "seed": args.seed, "out_dir": str(args.out_dir),
           "meta": run_meta(args, False), "jobs": args.jobs}
    with tempfile.TemporaryDirectory() as rdzv:
        try:
            mp.spawn(_rank_main, args=(world, rdzv, cfg), nprocs=world, join=True)
        except Exception as exc:  # noqa: BLE001 - the child's traceback is in the message
            log(f"bench_moe --ranks {world}: a rank failed:\n{exc}")
            return 1
    return 0


def _rank_main(rank: int, world: int, rdzv: str, cfg: dict) -> None:
    import torch.distributed as dist

    from nvfp4_ops.testing import init_nccl_rank

    device = init_nccl_rank(rank, world, f"{rdzv}/rendezvous")
    if rank == 0 and cfg["jobs"] > 0:
        precompile(cfg["shapes"], cfg["jobs"])
    dist.barrier()
    flush = l2_flush("read", device=device)
    rows = []
    try:
        for name in cfg["shapes"]:
            rows += _rank_shape(rank, world, get_shape(name), cfg, flush, dist)
        gathered = [None] * world
        dist.all_gather_object(gathered, rows)
        if rank == 0:
            _rank_report(world, gathered, cfg)
    finally:
        dist.destroy_process_group()


def _rank_shape(rank, world, shape, cfg, flush, dist) -> list[dict]:
    h, i, e = shape.hidden, shape.intermediate, shape.experts
    local = e // world
    start = rank * local
    dev = torch.device("cuda", rank)
    wperm = wperm_supported(h, i)
    full = None
    if rank == 0:  # all experts, for the single-GPU op; this rank's slice is a view
        full = fast_random_experts(e, h, i, device=dev, seed=cfg["seed"])
        mine = _expert_views(_nvfp4_tensors(full), start, local)
    else:
        mine = _nvfp4_tensors(fast_random_experts(local, h, i, device=dev, seed=cfg["seed"],
                                                  first_expert=start))
    for t in ([full.w13, full.w2] if full is not None else [mine["w13"], mine["w2"]]):
        if wperm:
            nvfp4_ops.to_wperm_(t)
    nvfp4_ops.warmup([shape.name])
    rows = []
    for num_tokens in cfg["tokens"]:
        ids, weights = cell_routing("uniform", num_tokens, e, shape.top_k, seed=cfg["seed"])
        gen = torch.Generator().manual_seed(cfg["seed"] * 7 + num_tokens)
        hidden = torch.randn(num_tokens, h, generator=gen).to(torch.bfloat16).to(dev)
        ids, weights = ids.to(dev), weights.to(dev)
        row = {"shape": shape.name, "T": num_tokens, "rank": rank, "expert_start": start,
               "local_experts": local}

        def local_moe(t=mine, hidden=hidden, ids=ids, weights=weights):
            return nvfp4_ops.moe(hidden, ids, weights, t["w13"], t["w13_scale"],
                                 t["w13_global"], t["w2"], t["w2_scale"], t["w2_global"],
                                 expert_start=start, global_num_experts=e,
                                 swiglu_limit=shape.swiglu_limit, wperm=wperm)

        try:
            row["local_us"] = time_one_call(local_moe, cfg["reps"], flush, cfg["warm_reps"])
        except Exception as exc:  # noqa: BLE001
            row["local_error"] = f"{type(exc).__name__}: {exc}"
        if full is not None:
            full_args = full.args()

            def single_gpu(args=full_args, hidden=hidden, ids=ids, weights=weights):
                return nvfp4_ops.moe(hidden, ids, weights, *args, global_num_experts=e,
                                     swiglu_limit=shape.swiglu_limit, wperm=wperm)

            try:
                row["single_gpu_us"] = time_one_call(single_gpu, cfg["reps"], flush,
                                                     cfg["warm_reps"])
            except Exception as exc:  # noqa: BLE001
                row["single_gpu_error"] = f"{type(exc).__name__}: {exc}"
        row["allreduce_us"], row["allreduce_mode"] = _time_allreduce(
            torch.randn(num_tokens, h, device=dev).to(torch.bfloat16), cfg["reps"], dist)
        log(f"rank {rank} {shape.name} T={num_tokens}: local "
            f"{row.get('local_us', float('nan')):.1f} us"
            + (f", single GPU {row['single_gpu_us']:.1f} us" if "single_gpu_us" in row else "")
            + f", all-reduce {row['allreduce_us']:.1f} us ({row['allreduce_mode']})")
        rows.append(row)
    del full, mine
    torch.cuda.empty_cache()
    return rows


def _time_allreduce(buf: torch.Tensor, reps: int, dist) -> tuple[float, str]:
    """Median µs of an in-place all-reduce of ``buf``, eagerly (a collective captured in a
    CUDA graph can hang a rank where capture is not supported, and a hang costs the whole
    call). The ranks are aligned by a barrier before each timed one; a GPU sleep before the
    start event hides the host's launch of the collective, so the events bracket device time
    (plus the ranks' residual skew of a few µs)."""
    dist.all_reduce(buf)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda._sleep(200_000)  # ~100 µs of GPU time while the host enqueues
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(buf)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2], "eager"


def _rank_report(world: int, gathered: list[list[dict]], cfg: dict) -> None:
    by_key: dict[tuple, dict] = {}
    for rows in gathered:
        for r in rows:
            entry = by_key.setdefault((r["shape"], r["T"]), {"shape": r["shape"], "T": r["T"],
                                                              "ranks": {}})
            entry["ranks"][r["rank"]] = r
            if "single_gpu_us" in r:
                entry["single_gpu_us"] = r["single_gpu_us"]
    rows = list(by_key.values())
    lines = [f"{'shape':9s} {'T':>6s} " + " ".join(f"{f'rank{r} us':>9s}" for r in range(world))
             + f" {'1-GPU us':>9s} {'allred us':>9s} {'EP/1-GPU':>8s}"]
    for row in rows:
        local = [row["ranks"].get(r, {}).get("local_us") for r in range(world)]
        ar = max(row["ranks"].get(r, {}).get("allreduce_us") or 0.0 for r in range(world))
        slowest = max((x for x in local if x), default=None)
        single = row.get("single_gpu_us")
        row["ep_layer_us"] = slowest + ar if slowest else None
        row["ep_over_single"] = row["ep_layer_us"] / single if slowest and single else None
        lines.append(f"{row['shape']:9s} {row['T']:6d} " + " ".join(num(x) for x in local)
                     + f" {num(single)} {num(ar)} {num(row['ep_over_single'], '8.2f', 8)}")
    out = Path(cfg["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench_moe_ranks{world}.json"
    path.write_text(json.dumps({"benchmark": "bench_moe --ranks", "world": world,
                                "meta": cfg["meta"], "rows": rows,
                                "columns": {"ep_layer_us": "slowest rank's local MoE + "
                                            "the all-reduce", "ep_over_single": "ep_layer_us / "
                                            "single_gpu_us"}}, indent=1))
    log("\n" + "\n".join(lines) + f"\nwrote {path}")


# --- main ---------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_moe.py", description=__doc__.split("\n")[0],
        epilog="The module docstring gives the method, the columns and the Humming asymmetry.")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES)
    parser.add_argument("--tokens", nargs="+", type=int, default=None,
                        help=f"token counts (default {' '.join(map(str, TOKENS))}; with --ranks "
                             f"{' '.join(map(str, RANKS_TOKENS))})")
    parser.add_argument("--routing", nargs="+", default=list(ROUTINGS), choices=ROUTINGS)
    parser.add_argument("--skew", type=float, default=1.2,
                        help="Zipf exponent of the skewed routing's expert popularity")
    parser.add_argument("--ep", nargs="+", type=int, default=list(EPS),
                        help="expert-parallel degrees; each times one rank in the middle")
    parser.add_argument("--format", nargs="+", default=["nvfp4"], choices=FORMATS)
    parser.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS,
                        help="implementations timed beside ours (none: --peers with no name)")
    parser.add_argument("--humming-gemm", choices=["auto", "indexed", "grouped"], default="auto",
                        help="Humming's MoE GEMM (auto: vLLM's choice, indexed without EP, "
                             "grouped_contiguous with EP)")
    parser.add_argument("--humming-fallback", action="store_true",
                        help="where Humming runs indexed, also build its grouped_contiguous "
                             "path and time that one if indexed fails")
    parser.add_argument("--reps", type=int, default=30, help="timed replays per median")
    parser.add_argument("--order", choices=("abba", "ab"), default="abba",
                        help="per cell: ours, Humming, Humming, ours (each the mean of its two "
                             "medians; default), or ours then Humming once")
    parser.add_argument("--warm-reps", type=int, default=3)
    parser.add_argument("--chained", type=int, default=0, metavar="N",
                        help="also time N calls per graph (throughput, labelled chained)")
    parser.add_argument("--check", action="store_true",
                        help="ours vs the reference at small T; Humming vs ours in every cell")
    parser.add_argument("--stages", action="store_true",
                        help="NVFP4: time routing / gather / GEMM 1 / GEMM 2 / combine of ours "
                             "separately (diagnostic)")
    parser.add_argument("--ranks", type=int, default=1,
                        help="N > 1: expert parallelism over N GPUs, one process each")
    parser.add_argument("--jobs", type=int, default=8,
                        help="compile our kernel variants in this many processes first (0: no)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=0.0, metavar="S",
                        help="start no cell after S seconds (0: no limit)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    parser.add_argument("--fake-timings", action="store_true",
                        help="no GPU: run the reporting path on timings from the estimate model "
                             "(files marked fake)")
    args = parser.parse_args(argv)
    args.tokens_given = args.tokens is not None
    args.tokens = args.tokens or list(TOKENS)
    if min(args.tokens) < 1:
        parser.error("--tokens must be >= 1")
    if args.reps < 1 or args.warm_reps < 0 or args.chained < 0:
        parser.error("--reps must be >= 1, --warm-reps and --chained >= 0")
    for name in args.shapes:
        for ep in args.ep:
            try:
                ep_slice(get_shape(name).experts, ep)
            except ValueError as exc:
                parser.error(f"--ep {ep} for {name}: {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ranks > 1:
        return run_ranks(args)
    plan = build_plan(args)
    log(describe_plan(plan, args))
    if args.dry_run:
        return 0
    fake = args.fake_timings
    if not fake and not torch.cuda.is_available():
        log("bench_moe: no CUDA device; nothing measured (--dry-run prints the plan, "
            "--fake-timings runs the reporting path)")
        return 0
    report = Report(args.out_dir, run_meta(args, fake), plan)
    t0 = time.monotonic()
    if fake:
        run_fake(plan, args, report)
    else:
        GPUBench(plan, args, report).run()
    report.finish()
    log("\n" + report.tables())
    for path in report.plots():
        log(f"wrote {path}")
    for fmt, shape in report.docs:
        log(f"wrote {report.path(fmt, shape, '.json')}")
    log(f"total {time.monotonic() - t0:.0f} s")
    if report.check_failed:
        log("bench_moe: a --check FAILED (see the lines marked FAILED)")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
