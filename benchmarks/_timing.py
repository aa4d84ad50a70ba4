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
