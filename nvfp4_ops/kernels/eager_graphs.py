"""CUDA graphs for repeated eager calls: one graph launch instead of several kernel launches.

An eager call that repeats an earlier one (a kept launch: :class:`nvfp4_ops.ops._eager.
Repeats`) still pays the host time of each kernel launch: ~4-6 µs per CuTeDSL binary or
Triton launch on the H200's host, where one graph launch costs ~3 µs. Two ways to use a
graph here, both exact because a graph holds the very launches a call would make:

* :func:`capture` captures launches whose arguments are all fixed (the MoE's GEMMs read only
  its reused buffers and the weights) once, after the first call loaded their binaries;
* :class:`AddressGraphs` captures a whole call whose per-call tensors (activations, ids,
  output) it keys by address: a caller's loop that hands the same addresses again (the
  caching allocator does, call after call, in a steady decode or prefill loop) replays the
  graph that wrote to exactly those addresses. A new address is only remembered; the second
  call with it captures, the third replays. Calls with ever-new addresses launch as before,
  and after :data:`MAX_CAPTURES` captures an entry stops capturing.

Nothing is captured while the caller itself captures a graph (its graph holds the launches
already) or with :data:`ENABLED` off; a failed capture is reported once and the calls launch
as before. Captures run on a side stream that waits for the current one; replays go to the
current stream.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable

import torch

__all__ = ["ENABLED", "AddressGraphs", "capture", "caller_capturing"]

#: replay repeated eager calls from CUDA graphs (tests and A/Bs switch it off to compare)
ENABLED = True
#: graphs kept per :class:`AddressGraphs` (least recently used dropped first): a loop that
#: frees its previous output after the next call allocates alternates between two addresses
MAX_GRAPHS = 4
#: captures per :class:`AddressGraphs`, after which it only launches (addresses that never
#: repeat often enough to pay a capture)
MAX_CAPTURES = 16
#: address keys remembered per :class:`AddressGraphs` while waiting for a second sighting
MAX_SEEN = 64

_side_streams: dict[int, torch.cuda.Stream] = {}


def caller_capturing() -> bool:
    """Whether the current stream is capturing a CUDA graph (the caller's own)."""
    return torch._C._cuda_isCurrentStreamCapturing()


def capture(launch: Callable[[], None], device: torch.device,
            what: str) -> torch.cuda.CUDAGraph | None:
    """``launch()`` captured into a CUDA graph on a side stream (not run), for later calls to
    replay on theirs; None, with a warning naming ``what``, if the capture fails.

    ``launch``'s binaries must already be loaded (a call ran it once): loading a module is
    not allowed inside a capture."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    side = _side_streams.get(index)
    if side is None:
        side = _side_streams[index] = torch.cuda.Stream(device)
    current = torch.cuda.current_stream(device)
    side.wait_stream(current)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(side):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                launch()
            finally:
                graph.capture_end()
    except Exception as exc:  # noqa: BLE001 - reported; the calls go on without a graph
        warnings.warn(f"{what}: capturing an eager call's launches failed ({exc!r}); its "
                      "later calls launch them one by one", RuntimeWarning, stacklevel=3)
        return None
    finally:
        current.wait_stream(side)
    return graph


class AddressGraphs:
    """The CUDA graphs of one kept launch, keyed by the addresses of its per-call tensors.

    ``run(tensors, launch, extra)``: ``launch()`` makes the call's launches with exactly
    ``tensors`` (and values the owner fixed); ``extra``: hashable values the launches also
    depend on that are not fixed by the owner. Replays the graph of that key if there is one,
    else launches (capturing first on a key's second sighting)."""

    __slots__ = ("device", "what", "graphs", "seen", "captures")

    def __init__(self, device: torch.device, what: str) -> None:
        self.device, self.what = device, what
        self.graphs: OrderedDict[tuple, torch.cuda.CUDAGraph] = OrderedDict()
        self.seen: OrderedDict[tuple, None] = OrderedDict()
        self.captures = 0

    def run(self, tensors: tuple[torch.Tensor, ...], launch: Callable[[], None],
            extra: tuple = ()) -> None:
        if not ENABLED or caller_capturing():
            launch()
            return
        # a plain loop: a generator costs a frame per call, and this runs on every eager call
        key = list(extra)
        for t in tensors:
            key.append(t.data_ptr())
        key = tuple(key)
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
            graph.replay()
            return
        if key not in self.seen or self.captures >= MAX_CAPTURES:
            self.seen[key] = None
            if len(self.seen) > MAX_SEEN:
                self.seen.popitem(last=False)
            launch()
            return
        del self.seen[key]
        self.captures += 1
        graph = capture(launch, self.device, self.what)
        if graph is None:  # reported; this entry stops capturing
            self.captures = MAX_CAPTURES
            launch()
            return
        self.graphs[key] = graph
        if len(self.graphs) > MAX_GRAPHS:
            self.graphs.popitem(last=False)
        graph.replay()
