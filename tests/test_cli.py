"""The main job as a command: ``python -m nvfp4_ops check``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "nvfp4_ops", *args], capture_output=True,
                          text=True, timeout=600, env=env, cwd=ROOT)


def test_check_tiny_passes_and_prints_table():
    res = _run("check", "--shape", "tiny", "--tokens", "12", "--device", "cpu")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "implementation" in out and "rel L2 vs bf16 ref" in out
    for row in ("moe eager", "moe compiled", "mlp eager"):
        assert row in out
    assert "CPU reference (pure torch)" in out
    assert "bitwise equal to eager" in out
    assert "quantizing experts to NVFP4" in out  # progress output
    assert out.rstrip().endswith("check passed")


def test_check_exits_nonzero_on_mismatch():
    # A zero tolerance cannot hold: the bf16-dequantized reference rounds its weights.
    res = _run("check", "--shape", "tiny", "--tokens", "4", "--device", "cpu", "--tol", "0")
    assert res.returncode == 1
    assert "MISMATCH" in res.stdout
    assert "check FAILED: moe eager" in res.stderr


def test_unknown_shape_is_a_clear_error():
    res = _run("check", "--shape", "v5")
    assert res.returncode == 2
    assert "invalid choice: 'v5'" in res.stderr
