"""A DeepSeek-V4-style MoE block (router top-k in torch -> nvfp4::moe + nvfp4::mlp shared
expert) under torch.compile(fullgraph=True) with a dynamic token count, and AOT round trips
(torch.export save/load; aot_compile save/load) that load in a fresh subprocess which imports
only nvfp4_ops. On the CPU (the references) and, marked ``gpu``, with CUDA tensors (the CUDA
kernels: the tiny shape's sizes are multiples of 128)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import nvfp4_ops
from nvfp4_ops.testing import random_moe_block

SHAPE = nvfp4_ops.get_shape("tiny")


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(3)
    return random_moe_block(SHAPE)


@pytest.fixture(scope="module")
def cuda_block():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(3)
    return random_moe_block(SHAPE, device="cuda")


def _block(request, device):
    return request.getfixturevalue("cuda_block" if device == "cuda" else "block")


def _x(t: int, device: str = "cpu") -> torch.Tensor:
    return torch.randn(t, SHAPE.hidden, device=device).to(torch.bfloat16)


def test_block_compiles_fullgraph_without_breaks(block):
    x = _x(9)
    explanation = torch._dynamo.explain(block)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
    ops = {str(n.target) for g in explanation.graphs for n in g.graph.nodes
           if n.op == "call_function"}
    assert {"nvfp4.moe", "nvfp4.mlp"} <= {o.removesuffix(".default") for o in ops}, ops


@pytest.mark.parametrize("device", DEVICES)
def test_block_compiled_dynamic_matches_eager(request, device):
    block = _block(request, device)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, dynamic=True)
    for t in (5, 17, 64, 1):
        x = _x(t, device)
        torch._dynamo.mark_dynamic(x, 0)
        _assert_matches(compiled(x), block(x), device, f"T={t}")


def _assert_matches(got, want, device, what):
    """Bitwise on the CPU; on CUDA the router's softmax may be a generated kernel whose last
    bits differ from eager's (the ops themselves are deterministic), so within bf16 noise."""
    if device == "cpu":
        assert torch.equal(got, want), what
    else:
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        assert not got.isnan().any() and err < 5e-3, f"{what}: relative L2 {err:.2e}"


def _run_fresh(load: str, check: str, tmp_path: Path) -> str:
    """Run ``load`` then ``check`` in a new interpreter that imports only nvfp4_ops (and
    torch)."""
    path = tmp_path / "load.py"
    path.write_text(textwrap.dedent(load) + textwrap.dedent(check))
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    # this checkout first, then whatever the caller's path holds (cutlass-dsl may live there)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=600, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


_CHECK = """
    def same(a, b):  # bitwise on the CPU; within bf16 noise on CUDA (see _assert_matches)
        if a.device.type == "cpu":
            return torch.equal(a, b)
        return ((a.float() - b.float()).norm() / b.float().norm()).item() < 5e-3

    x, want = torch.load(r"{io}")
    out = fn(x)
    assert out.device == want.device and same(out, want), (out - want).abs().max()
    x2, want2 = torch.load(r"{io2}")
    out2 = fn(x2)
    assert same(out2, want2), "second token count differs"
    print("round trip ok", out.device.type, tuple(out.shape), tuple(out2.shape))
"""


def _save_io(block, tmp_path, device="cpu"):
    x, x2 = _x(11, device), _x(4, device)
    torch.save((x, block(x)), tmp_path / "io.pt")
    torch.save((x2, block(x2)), tmp_path / "io2.pt")
    return dict(io=tmp_path / "io.pt", io2=tmp_path / "io2.pt")


@pytest.mark.parametrize("device", DEVICES)
def test_export_save_load_in_fresh_process(request, device, tmp_path):
    block = _block(request, device)
    t = torch.export.Dim("T", min=1, max=4096)
    ep = torch.export.export(block, (_x(8, device),), dynamic_shapes={"x": {0: t}})
    torch.export.save(ep, tmp_path / "block.pt2")
    files = _save_io(block, tmp_path, device)
    out = _run_fresh(f"""
        import torch
        import nvfp4_ops  # registers torch.ops.nvfp4.*
        fn = torch.export.load(r"{tmp_path / 'block.pt2'}").module()
    """, _CHECK.format(**files), tmp_path)
    assert "round trip ok" in out


@pytest.mark.parametrize("device", DEVICES)
def test_aot_compile_save_load_in_fresh_process(request, device, tmp_path):
    block = _block(request, device)

    def forward(module, x):
        return module(x)

    if not (hasattr(torch.compiler, "load_compiled_function")
            and hasattr(torch.compile(forward), "aot_compile")):
        pytest.skip(f"torch {torch.__version__} has no torch.compile(...).aot_compile / "
                    "torch.compiler.load_compiled_function (vLLM's pin, torch 2.14, has both)")

    # Under dynamic=True dynamo would turn the block's Python floats (swiglu limit, routed
    # scale) into symbolic floats and restart analysis, which aot_compile cannot do.
    with torch._dynamo.config.patch(specialize_float=True):
        compiled = torch.compile(forward, fullgraph=True, dynamic=True).aot_compile(
            ((block, _x(8, device)), {}))
    compiled.save_compiled_function(str(tmp_path / "forward.bin"))
    torch.save(block, tmp_path / "block.pt")
    files = _save_io(block, tmp_path, device)
    out = _run_fresh(f"""
        import torch
        import nvfp4_ops  # registers torch.ops.nvfp4.*
        with open(r"{tmp_path / 'forward.bin'}", "rb") as f:
            loaded = torch.compiler.load_compiled_function(f)
        block = torch.load(r"{tmp_path / 'block.pt'}", weights_only=False)
        fn = lambda x: loaded(block, x)
    """, _CHECK.format(**files), tmp_path)
    assert "round trip ok" in out
