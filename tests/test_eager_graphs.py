"""``nvfp4_ops.kernels.eager_graphs.AddressGraphs``'s bookkeeping on the CPU: when a key is
remembered, captured and replayed, the caps on graphs and captures, and the cases that only
launch (switch off, the caller capturing, a failed capture). A stand-in replaces the CUDA
capture: it records the launch and replays it by calling it. The real graphs' exactness is
tested on the GPU (``test_moe_gpu.py``, ``test_linear_gpu.py``)."""

from __future__ import annotations

import pytest
import torch

from nvfp4_ops.kernels import eager_graphs


class _Graph:
    def __init__(self, launch):
        self.launch, self.replays = launch, 0

    def replay(self):
        self.replays += 1
        self.launch()


@pytest.fixture
def graphs(monkeypatch):
    """An AddressGraphs whose captures are stand-ins (``graphs.made``: the ones captured)."""
    made = []

    def capture(launch, device, what):
        made.append(_Graph(launch))
        return made[-1]

    monkeypatch.setattr(eager_graphs, "capture", capture)
    monkeypatch.setattr(eager_graphs, "caller_capturing", lambda: False)
    return _Tracked(eager_graphs.AddressGraphs(torch.device("cpu"), "test"), made)


class _Tracked:
    """An AddressGraphs and the stand-in graphs it captured."""

    def __init__(self, graphs, made):
        self.graphs, self.made = graphs, made

    def __getattr__(self, name):
        return getattr(self.graphs, name)

    def run(self, *args):
        self.graphs.run(*args)


def _call(graphs, tensors, extra=()):
    """One call of ``tensors``: how many times this call's own launch function ran (1 when
    launched or captured and then replayed; 0 when an earlier call's graph replayed) and how
    the call ran: 'launch', 'replay' or 'capture'."""
    ran = []
    before = (len(graphs.made), sum(m.replays for m in graphs.made))
    graphs.run(tensors, lambda: ran.append(1), extra)
    made, replays = len(graphs.made), sum(m.replays for m in graphs.made)
    how = "capture" if made > before[0] else "replay" if replays > before[1] else "launch"
    return len(ran), how


def test_second_sighting_captures_third_replays(graphs):
    x, y = torch.zeros(4), torch.zeros(4)
    assert _call(graphs, (x, y)) == (1, "launch")
    assert _call(graphs, (x, y)) == (1, "capture")  # captured, then replayed once
    assert _call(graphs, (x, y)) == (0, "replay")
    z = torch.zeros(4)
    assert _call(graphs, (z, y)) == (1, "launch")  # a new address: remembered only
    assert _call(graphs, (x, y), extra=(torch.int64,)) == (1, "launch")  # a new extra value
    assert _call(graphs, (x, y)) == (0, "replay")


def test_caps_on_graphs_and_captures(graphs, monkeypatch):
    monkeypatch.setattr(eager_graphs, "MAX_GRAPHS", 2)
    monkeypatch.setattr(eager_graphs, "MAX_CAPTURES", 3)
    bufs = [torch.zeros(2) for _ in range(5)]
    for b in bufs[:3]:
        _call(graphs, (b,))
        assert _call(graphs, (b,))[1] == "capture"
    assert len(graphs.graphs.graphs) == 2  # the oldest dropped
    assert _call(graphs, (bufs[0],)) == (1, "launch")
    assert _call(graphs, (bufs[2],)) == (0, "replay")
    for b in bufs[3:]:  # no captures left: launched, however often seen
        for _ in range(3):
            assert _call(graphs, (b,)) == (1, "launch")


def test_off_and_under_the_callers_capture_only_launch(graphs, monkeypatch):
    x = torch.zeros(3)
    _call(graphs, (x,))
    _call(graphs, (x,))
    monkeypatch.setattr(eager_graphs, "ENABLED", False)
    assert _call(graphs, (x,)) == (1, "launch")
    monkeypatch.setattr(eager_graphs, "ENABLED", True)
    monkeypatch.setattr(eager_graphs, "caller_capturing", lambda: True)
    assert _call(graphs, (x,)) == (1, "launch")


def test_a_failed_capture_launches_and_stops_capturing(graphs, monkeypatch):
    monkeypatch.setattr(eager_graphs, "capture", lambda launch, device, what: None)
    x, y = torch.zeros(3), torch.zeros(3)
    for t in (x, y):
        assert _call(graphs, (t,)) == (1, "launch")
    assert _call(graphs, (x,)) == (1, "launch")  # the capture failed: launched
    assert graphs.captures == eager_graphs.MAX_CAPTURES and not graphs.graphs.graphs
    assert _call(graphs, (y,)) == (1, "launch")


def test_remembered_addresses_are_capped(graphs, monkeypatch):
    monkeypatch.setattr(eager_graphs, "MAX_SEEN", 3)
    bufs = [torch.zeros(2) for _ in range(4)]
    for b in bufs:
        _call(graphs, (b,))
    assert len(graphs.seen) == 3
    assert _call(graphs, (bufs[0],)) == (1, "launch")  # forgotten: a first sighting again
    assert _call(graphs, (bufs[3],)) == (1, "capture")
