"""Device timing shared by the benchmark and dev scripts: CUDA-graph replays timed with CUDA
events, median per call in microseconds (the method of METHOD.md: device time only, no launch
overhead from Python)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


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


def read_flush(nbytes: int = 256 * 2**20, device: str | torch.device = "cuda"
               ) -> Callable[[], object]:
    """A callable that evicts L2 by *reading* ``nbytes`` (a sum into a preallocated scalar).

    Reading leaves clean lines behind. A write flush (a fill) leaves L2 full of dirty lines whose
    write-back then competes with the next, timed, kernel for HBM bandwidth, inflating short
    calls by several µs.
    """
    buf = torch.ones(nbytes // 4, dtype=torch.int32, device=device)
    acc = torch.zeros((), dtype=torch.int64, device=device)
    return lambda: torch.sum(buf, out=acc)


def time_graph(fn: Callable[[], object], reps: int, warm_reps: int = 3,
               before_each: Callable[[], object] | None = None, calls_per_graph: int = 1) -> float:
    """Median µs per call of ``fn`` replayed from a CUDA graph holding ``calls_per_graph``
    calls of it (1: single-call latency; more: a chained, throughput figure), ``before_each``
    (e.g. :func:`read_flush`) run untimed before every timed replay.

    ``fn`` runs ``warm_reps`` times on a side stream first, so that nothing compiles or
    allocates for the first time inside the capture.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warm_reps):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = capture([fn] * calls_per_graph)
    try:
        return replay_median_us(graph, reps, calls_per_graph, before_each)
    finally:
        del graph
