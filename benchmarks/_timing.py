"""Device timing shared by the benchmarks and the dev scripts.

The method (device time only, no Python launch overhead in the numbers):

* **One op call per CUDA-graph replay**, timed with CUDA events around the replay; the median
  over many replays is reported, in µs per call. Warm up first (compile, module load) and
  capture after, so nothing compiles inside a timed region.
* **L2 flushed by a read before every timed replay** (:func:`l2_flush`, untimed): a reduction
  over a buffer larger than the 50-60 MB L2 of an H100 / H200 evicts the weights and the
  activations without leaving dirty lines behind. Flushing by *writing* the buffer leaves L2
  full of dirty lines whose write-back is charged to the next kernel (on an H200 the same
  M = 1 linear took 35.6 µs after a write flush, 32.3-32.6 µs after a read flush;
  ``nvfp4_ops/kernels/DESIGN.md``, "Timing").
* **Baselines in the same process** as the op they are compared with, so machine
  differences hit both alike (``bench_linear`` times the baseline right after the op;
  ``bench_moe`` times bf16 in a phase of its own, since its V4-Pro weights are 51 GB).
* **Chained figures are throughput**: a graph of many back-to-back calls (:func:`capture` of a
  list) lets each call overlap the previous one's tail (launch overlap); its per-call time is
  close to a call that follows an unrelated small kernel, but it is a throughput figure and
  must be labelled as one.
"""

from __future__ import annotations

import os
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch

_REPO = Path(__file__).resolve().parents[1]

__all__ = ["L2_FLUSH_BYTES", "capture", "l2_flush", "replay_median_us", "time_chained",
           "time_one_call", "warm_capture"]

#: flush buffer size: 256 MiB, four to five times the L2 of an H100 / H200
L2_FLUSH_BYTES = 256 * 2**20


def capture(calls: list[Callable[[], object]]) -> torch.cuda.CUDAGraph:
    """One CUDA graph holding ``calls`` in order (run them once before: no compile in capture)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return graph


def replay_median_us(graph: torch.cuda.CUDAGraph, iters: int, calls_per_replay: int = 1,
                     before_each: Callable[[], object] | None = None) -> float:
    """Median over ``iters`` timed replays of ``graph``, in µs per call (``calls_per_replay``
    calls per graph). ``before_each`` (e.g. an L2 flush) runs before each replay, untimed."""
    times = []
    for _ in range(iters):
        if before_each is not None:
            before_each()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls_per_replay)
    return statistics.median(times)


def l2_flush(mode: str = "read", nbytes: int = L2_FLUSH_BYTES,
             device: str | torch.device = "cuda",
             buf: torch.Tensor | None = None) -> Callable[[], object]:
    """A callable that evicts L2 through a ``uint8`` buffer of ``nbytes`` (or ``buf``):
    ``read`` reduces over it (clean lines: the method), ``write`` fills it (dirty lines, kept
    to reproduce older results).

    Raises:
        ValueError: ``mode`` is neither ``read`` nor ``write``.
    """
    if mode not in ("read", "write"):
        raise ValueError(f"flush mode must be read or write, got {mode!r}")
    if buf is None:
        buf = torch.ones(nbytes, dtype=torch.uint8, device=device)
    if mode == "write":
        return lambda: buf.fill_(1)
    return lambda: torch.amax(buf)


def warm_capture(fn: Callable[[], object], calls: int = 1,
                 warmup: int = 2) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` back-to-back calls of ``fn``, replayed once: ``fn`` runs
    ``warmup`` times eagerly on a side stream first (compiles, loads modules, fills allocator
    pools), so nothing compiles inside the capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = capture([fn] * calls)
    graph.replay()
    torch.cuda.synchronize()
    return graph


def _graph_median_us(fn: Callable[[], object], calls: int, iters: int,
                     flush: Callable[[], object] | None, warmup: int) -> float:
    """Median µs per call of a CUDA graph of ``calls`` back-to-back calls of ``fn``, ``flush``
    before every timed replay (:func:`warm_capture`)."""
    graph = warm_capture(fn, calls, warmup)
    us = replay_median_us(graph, iters, calls_per_replay=calls, before_each=flush)
    del graph
    return us


def time_one_call(fn: Callable[[], object], iters: int,
                  flush: Callable[[], object] | None, warmup: int = 2) -> float:
    """Median µs of one call of ``fn`` per CUDA-graph replay, ``flush`` (:func:`l2_flush`)
    before every timed replay. ``fn`` runs ``warmup`` times eagerly on a side stream first
    (compiles, loads modules, fills allocator pools), then once inside the captured graph."""
    return _graph_median_us(fn, 1, iters, flush, warmup)


def time_chained(fn: Callable[[], object], calls: int, iters: int,
                 flush: Callable[[], object] | None, warmup: int = 1) -> float:
    """Median µs per call of a CUDA graph holding ``calls`` back-to-back calls of ``fn``,
    ``flush`` before every timed replay: a throughput figure (each call may overlap the
    previous one's tail), to be labelled "chained", never reported as a latency. ``fn`` runs
    ``warmup`` times eagerly on a side stream first, as in :func:`time_one_call`."""
    return _graph_median_us(fn, calls, iters, flush, warmup)


def git_commit() -> str:
    """``NVFP4_OPS_COMMIT`` when set (the GPU machine gets a copy of the tree whose ``.git``,
    if any, is not the tree's), else HEAD (``+dirty`` with local changes), else "unknown"."""
    if os.environ.get("NVFP4_OPS_COMMIT"):
        return os.environ["NVFP4_OPS_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", str(_REPO), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(_REPO), "status", "--porcelain",
                                    "--untracked-files=no"], capture_output=True, text=True,
                                   timeout=10).stdout.strip()
            return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"
