"""``python -m nvfp4_ops check``: the main job, end to end on one DeepSeek-V4-shaped MoE layer.

It quantizes random bf16 experts to NVFP4, routes random tokens, runs ``nvfp4::moe`` eagerly,
under ``torch.compile(fullgraph=True)`` and (on a GPU with a graph-safe kernel) inside a
CUDA graph, plus the ``nvfp4::mlp`` shared expert, and prints a table: which implementation
ran, its error against an independent bf16-dequantized reference, and its time. It exits 1
if any error is above ``--tol`` or a compiled/graph output differs from eager.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import nvfp4_ops
from nvfp4_ops import kernels
from nvfp4_ops.modules import MoEBlock
from nvfp4_ops.reference.mlp import clamped_swiglu
from nvfp4_ops.shapes import SHAPES, get_shape
from nvfp4_ops.testing import moe_bf16_dequantized, random_moe_block, random_routing, rel_l2


@dataclass
class Row:
    what: str
    impl: str
    rel_err: float | None  # relative L2 error vs the bf16-dequantized reference
    max_abs: float | None
    ms: float | None
    ok: bool
    note: str = ""


def _log(msg: str) -> None:
    print(f"[check] {msg}", flush=True)


def _time_ms(fn: Callable[[], torch.Tensor], device: torch.device, reps: int) -> float:
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _mlp_bf16_reference(block: MoEBlock, x: torch.Tensor) -> torch.Tensor:
    """The shared expert with bf16-dequantized weights (independent of the op's reference)."""
    inter = block.s13.shape[0] // 2
    deq = nvfp4_ops.format.dequantize
    w_gate = deq(block.s13[:inter], block.s13_scale[:inter], block.s13_global[0])
    w_up = deq(block.s13[inter:], block.s13_scale[inter:], block.s13_global[1])
    w_down = deq(block.s2, block.s2_scale, block.s2_global)
    bf = torch.bfloat16
    act = clamped_swiglu(x @ w_gate.to(bf).T, x @ w_up.to(bf).T, block.swiglu_limit).to(bf)
    return (act @ w_down.to(bf).T).to(bf)


def _compare(what: str, impl: str, out: torch.Tensor, ref: torch.Tensor, ms: float | None,
             tol: float) -> Row:
    finite = bool(torch.isfinite(out).all())
    err = rel_l2(out, ref)
    max_abs = (out.float() - ref.float()).abs().max().item() if out.numel() else 0.0
    ok = finite and err <= tol
    return Row(what, impl, err, max_abs, ms, ok, "" if finite else "NaN/Inf in output")


def _same(what: str, impl: str, out: torch.Tensor, eager: torch.Tensor, ref: torch.Tensor,
          ms: float | None, tol: float) -> Row:
    row = _compare(what, impl, out, ref, ms, tol)
    if not torch.equal(out, eager):
        row.ok = False
        row.note = "differs from eager"
    else:
        row.note = "bitwise equal to eager"
    return row


def run(args: argparse.Namespace) -> list[Row]:
    shape = get_shape(args.shape)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    num_experts = shape.experts if args.experts is None else args.experts
    _log(f"shape {shape.name}: H={shape.hidden} I={shape.intermediate} E={num_experts} "
         f"k={shape.top_k} T={args.tokens} on {device} (torch {torch.__version__})")

    t0 = time.perf_counter()
    step = max(1, num_experts // 8)

    def progress(done: int, total: int) -> None:
        if done % step == 0 or done == total:
            _log(f"quantizing experts to NVFP4: {done}/{total} "
                 f"({time.perf_counter() - t0:.1f} s)")

    block = random_moe_block(shape, device=device, num_experts=num_experts, progress=progress)
    x = (torch.randn(args.tokens, shape.hidden, device=device)).to(torch.bfloat16)
    ids, weights = random_routing(args.tokens, num_experts, shape.top_k, device=device)

    _log("bf16-dequantized reference ...")
    ref = moe_bf16_dequantized(x, ids, weights, block.experts,
                               swiglu_limit=shape.swiglu_limit,
                               output_scale=shape.routed_scaling_factor)
    rows: list[Row] = []
    impl = kernels.describe("moe", device)

    _log("nvfp4::moe eager ...")
    eager = block.routed(x, ids, weights)
    ms = _time_ms(lambda: block.routed(x, ids, weights), device, args.reps)
    rows.append(_compare("moe eager", impl, eager, ref, ms, args.tol))

    _log("nvfp4::moe under torch.compile(fullgraph=True, dynamic=True) ...")
    compiled = torch.compile(block.routed, fullgraph=True, dynamic=True)
    out = compiled(x, ids, weights)
    ms = _time_ms(lambda: compiled(x, ids, weights), device, args.reps)
    rows.append(_same("moe compiled", impl, out, eager, ref, ms, args.tol))

    if device.type == "cuda":
        rows.append(_cuda_graph_row(block, x, ids, weights, eager, ref, impl, args))

    _log("nvfp4::mlp (shared expert) eager ...")
    mlp = lambda: torch.ops.nvfp4.mlp(x, block.s13, block.s13_scale, block.s13_global,  # noqa: E731
                                      block.s2, block.s2_scale, block.s2_global,
                                      shape.swiglu_limit)
    out = mlp()
    ms = _time_ms(mlp, device, args.reps)
    rows.append(_compare("mlp eager", kernels.describe("mlp", device), out,
                         _mlp_bf16_reference(block, x), ms, args.tol))
    return rows


def _cuda_graph_row(block, x, ids, weights, eager, ref, impl, args) -> Row:
    if "kernel" not in impl:
        return Row("moe CUDA graph", impl, None, None, None, True,
                   "skipped: the GPU reference syncs with the host, not capturable")
    _log("nvfp4::moe in a CUDA graph ...")
    static = [t.clone() for t in (x, ids, weights)]
    nvfp4_ops.warmup([block.shape.name])  # compile + run every variant before capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        block.routed(*static)  # warm the allocator on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = block.routed(*static)
    out.fill_(float("nan"))
    graph.replay()
    ms = _time_ms(lambda: graph.replay(), x.device, args.reps)
    return _same("moe CUDA graph", impl, out, eager, ref, ms, args.tol)


def format_table(rows: list[Row]) -> str:
    head = ("what", "implementation", "rel L2 vs bf16 ref", "max abs", "ms", "result")
    body = [
        (r.what, r.impl,
         "-" if r.rel_err is None else f"{r.rel_err:.2e}",
         "-" if r.max_abs is None else f"{r.max_abs:.3g}",
         "-" if r.ms is None else f"{r.ms:.3f}",
         ("ok" if r.ok else "MISMATCH") + (f" ({r.note})" if r.note else ""))
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])


DESCRIPTION = """\
Quantize random bf16 experts of a DeepSeek-V4-shaped MoE layer to NVFP4, route random tokens,
run nvfp4::moe eagerly, under torch.compile(fullgraph=True) and (on a GPU with a graph-safe
kernel) in a CUDA graph, plus the nvfp4::mlp shared expert, and print which implementation
ran, its error against an independent bf16-dequantized reference and its time. Exits 1 if an
error is above --tol or a compiled / graph output differs from eager."""


def _parse_device(p: argparse.ArgumentParser, text: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``, refused with one line unless it can run here."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        p.error(f"--device must be cpu, cuda or cuda:N, got {text!r}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            p.error(f"--device {text}: CUDA is not available here (torch {torch.__version__}, "
                    f"CUDA build {torch.version.cuda or 'none'}); use --device cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            p.error(f"--device {text}: this machine has {count} CUDA device(s)")
        from nvfp4_ops import _device

        try:
            _device.require_supported_gpu(device)
        except _device.NVFP4UnsupportedGPUError as exc:
            p.error(f"--device {text}: {exc}")
    return device


def main(argv: list[str], prog: str = "python -m nvfp4_ops check") -> int:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="tiny", choices=sorted(SHAPES),
                   help="layer shape (default tiny: seconds on a CPU; v4-* want a GPU)")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens T >= 1 (default 64 on CUDA, 16 on CPU)")
    p.add_argument("--experts", type=int, default=None,
                   help="override the number of routed experts (>= the shape's top-k; "
                        "default: the shape's)")
    p.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default cuda when available, else cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reps", type=int, default=3, help="timed repetitions, >= 1 (median)")
    p.add_argument("--tol", type=float, default=1e-2,
                   help="max relative L2 error vs the bf16-dequantized reference (>= 0)")
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = _parse_device(p, args.device)
    shape = get_shape(args.shape)
    if args.tokens is None:
        args.tokens = 64 if device.type == "cuda" else 16
    if args.tokens < 1:
        p.error(f"--tokens must be >= 1, got {args.tokens}")
    if args.experts is not None and args.experts < shape.top_k:
        p.error(f"--experts must be >= the top-k of shape {shape.name} ({shape.top_k}): every "
                f"token is routed to {shape.top_k} distinct experts; got {args.experts}")
    if args.reps < 1:
        p.error(f"--reps must be >= 1, got {args.reps}")
    if not (math.isfinite(args.tol) and args.tol >= 0):
        p.error(f"--tol must be a finite number >= 0, got {args.tol}")
    try:
        rows = run(args)
    except nvfp4_ops.NVFP4EnvError as exc:  # a bad NVFP4_OPS_* value: one line, no traceback
        p.error(str(exc))
    print(format_table(rows), flush=True)
    bad = [r for r in rows if not r.ok]
    if bad:
        print(f"check FAILED: {', '.join(r.what for r in bad)}", file=sys.stderr)
        return 1
    print("check passed")
    return 0
