"""A DeepSeek-V4-style MoE block (router top-k in torch -> nvfp4::moe + nvfp4::mlp shared
expert) under torch.compile(fullgraph=True) with a dynamic token count, and AOT round trips
(torch.export save/load; aot_compile save/load) that load in a fresh subprocess which imports
only nvfp4_ops."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import nvfp4_ops
from nvfp4_ops.modules import MoEBlock

SHAPE = nvfp4_ops.get_shape("tiny")


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(3)
    return MoEBlock.random(SHAPE)


def _x(t: int) -> torch.Tensor:
    return torch.randn(t, SHAPE.hidden).to(torch.bfloat16)


def test_block_compiles_fullgraph_without_breaks(block):
    x = _x(9)
    explanation = torch._dynamo.explain(block)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    ops = {str(n.target) for g in explanation.graphs for n in g.graph.nodes
           if n.op == "call_function"}
    assert {"nvfp4.moe", "nvfp4.mlp"} <= {o.removesuffix(".default") for o in ops}, ops


def test_block_compiled_dynamic_matches_eager(block):
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for t in (5, 17, 64, 1):
        x = _x(t)
        torch._dynamo.mark_dynamic(x, 0)
        assert torch.equal(compiled(x), block(x)), f"T={t}"


def _run_fresh(load: str, check: str, tmp_path: Path) -> str:
    """Run ``load`` then ``check`` in a new interpreter that imports only nvfp4_ops (and
    torch)."""
    path = tmp_path / "load.py"
    path.write_text(textwrap.dedent(load) + textwrap.dedent(check))
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=600,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


_CHECK = """
    x, want = torch.load(r"{io}")
    out = fn(x)
    assert torch.equal(out, want), (out - want).abs().max()
    x2, want2 = torch.load(r"{io2}")
    out2 = fn(x2)
    assert torch.equal(out2, want2), "second token count differs"
    print("round trip ok", tuple(out.shape), tuple(out2.shape))
"""


def _save_io(block, tmp_path):
    x, x2 = _x(11), _x(4)
    torch.save((x, block(x)), tmp_path / "io.pt")
    torch.save((x2, block(x2)), tmp_path / "io2.pt")
    return dict(io=tmp_path / "io.pt", io2=tmp_path / "io2.pt")


def test_export_save_load_in_fresh_process(block, tmp_path):
    t = torch.export.Dim("T", min=1, max=4096)
    ep = torch.export.export(block, (_x(8),), dynamic_shapes={"x": {0: t}})
    torch.export.save(ep, tmp_path / "block.pt2")
    files = _save_io(block, tmp_path)
    out = _run_fresh(f"""
        import torch
        import nvfp4_ops  # registers torch.ops.nvfp4.*
        fn = torch.export.load(r"{tmp_path / 'block.pt2'}").module()
    """, _CHECK.format(**files), tmp_path)
    assert "round trip ok" in out


def test_aot_compile_save_load_in_fresh_process(block, tmp_path):
    if not hasattr(torch.compiler, "load_compiled_function"):
        pytest.skip(f"torch {torch.__version__} has no torch.compiler.load_compiled_function")

    def forward(module, x):
        return module(x)

    # Under dynamic=True dynamo would turn the block's Python floats (swiglu limit, routed
    # scale) into symbolic floats and restart analysis, which aot_compile cannot do.
    with torch._dynamo.config.patch(specialize_float=True):
        compiled = torch.compile(forward, fullgraph=True, dynamic=True).aot_compile(
            ((block, _x(8)), {}))
    compiled.save_compiled_function(str(tmp_path / "forward.bin"))
    torch.save(block, tmp_path / "block.pt")
    files = _save_io(block, tmp_path)
    out = _run_fresh(f"""
        import torch
        import nvfp4_ops  # registers torch.ops.nvfp4.*
        with open(r"{tmp_path / 'forward.bin'}", "rb") as f:
            loaded = torch.compiler.load_compiled_function(f)
        block = torch.load(r"{tmp_path / 'block.pt'}", weights_only=False)
        fn = lambda x: loaded(block, x)
    """, _CHECK.format(**files), tmp_path)
    assert "round trip ok" in out
