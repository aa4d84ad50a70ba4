"""The command line: ``python -m nvfp4_ops check|precompile`` (also ``nvfp4-ops``): the main
job end to end, argument errors in one line with exit code 2, help text, a quiet import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


# --- argument errors: one line, exit code 2, no traceback -----------------------------------
CHECK_ERRORS = {
    "tokens -1": (["--tokens", "-1"], "--tokens must be >= 1, got -1"),
    "tokens 0": (["--tokens", "0"], "--tokens must be >= 1, got 0"),
    "device bogus": (["--device", "bogus"], "--device must be cpu, cuda or cuda:N, got 'bogus'"),
    "device meta": (["--device", "meta"], "--device must be cpu, cuda or cuda:N, got 'meta'"),
    "reps 0": (["--reps", "0"], "--reps must be >= 1, got 0"),
    "experts 0": (["--experts", "0"], "--experts must be >= the top-k of shape tiny (6)"),
    "experts below top-k": (["--experts", "5"], "--experts must be >= the top-k of shape tiny "
                                                "(6): every token is routed to 6 distinct "
                                                "experts; got 5"),
    "tol negative": (["--tol", "-1"], "--tol must be a finite number >= 0, got -1.0"),
    "tol nan": (["--tol", "nan"], "--tol must be a finite number >= 0, got nan"),
}


def _one_line_error(capsys, fn, *args) -> str:
    with pytest.raises(SystemExit) as info:
        fn(*args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("usage: ") and lines[-1].count("error: ") == 1, err
    return lines[-1]


@pytest.mark.parametrize("case", list(CHECK_ERRORS))
def test_check_argument_errors(capsys, case):
    from nvfp4_ops.cli import check

    argv, message = CHECK_ERRORS[case]
    line = _one_line_error(capsys, check.main, ["--device", "cpu", *argv] if "--device" not in argv
                           else argv)
    assert line.startswith("python -m nvfp4_ops check: error: ")
    assert message in line, line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_check_cuda_without_cuda(capsys):
    from nvfp4_ops.cli import check

    line = _one_line_error(capsys, check.main, ["--device", "cuda"])
    assert "--device cuda: CUDA is not available here" in line and "--device cpu" in line


def test_check_unsupported_gpu_is_one_line(capsys, monkeypatch):
    """On a GPU the kernels cannot run on, check says so before building anything."""
    from nvfp4_ops import _device
    from nvfp4_ops.cli import check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(_device, "_supported", {})
    monkeypatch.setattr(_device, "_current_index", lambda: 0)
    monkeypatch.setattr(_device, "_capability", lambda i: (8, 9))
    monkeypatch.setattr(_device, "_name", lambda i: "NVIDIA L40S")
    line = _one_line_error(capsys, check.main, ["--device", "cuda:0"])
    assert "NVIDIA L40S with compute capability 8.9" in line
    assert "NVFP4_OPS_BACKEND=reference" in line


def test_check_bad_switch_is_one_line(capsys, monkeypatch):
    from nvfp4_ops.cli import check

    monkeypatch.setenv("NVFP4_OPS_VALUE_CHECKS", "maybe")
    line = _one_line_error(capsys, check.main, ["--device", "cpu", "--tokens", "2",
                                                "--experts", "6"])
    assert "NVFP4_OPS_VALUE_CHECKS must be one of" in line and "'maybe'" in line


def test_precompile_unknown_shape(capsys):
    from nvfp4_ops.cli import precompile

    line = _one_line_error(capsys, precompile.main, ["--shape", "bogus"])
    assert "argument --shape: invalid choice: 'bogus'" in line


def test_precompile_bad_mxfp4_switch_is_one_line(capsys, monkeypatch):
    from nvfp4_ops.cli import precompile

    monkeypatch.setenv("NVFP4_OPS_MXFP4_SCALES", "ue8m0")
    line = _one_line_error(capsys, precompile.main, ["--shape", "tiny", "--no-run"])
    assert "NVFP4_OPS_MXFP4_SCALES must be 'auto', 'convert' or 'native', got 'ue8m0'" in line


def test_precompile_names_the_mxfp4_variants_it_includes(capsys, monkeypatch):
    """The banner names the shapes whose MXFP4 (``mx``) variants are in the set: by default
    those the kernels read natively (V4-Flash, not ``tiny``), none with
    ``NVFP4_OPS_MXFP4_SCALES=convert`` or ``--no-moe`` (the compile itself is stubbed out)."""
    pytest.importorskip("cutlass")
    import nvfp4_ops
    from nvfp4_ops.cli import precompile

    monkeypatch.setattr(nvfp4_ops, "warmup", lambda *a, **k: [])
    monkeypatch.setattr(precompile, "_configs", lambda *a: [])
    args = ["--shape", "v4-flash", "--shape", "tiny", "--no-run"]

    def banner(argv):
        assert precompile.main(argv) == 0
        return capsys.readouterr().out.splitlines()[0]

    monkeypatch.delenv("NVFP4_OPS_MXFP4_SCALES", raising=False)
    assert "(MXFP4 variants of v4-flash too)" in banner(args)
    assert "MXFP4" not in banner([*args, "--no-moe"])
    monkeypatch.setenv("NVFP4_OPS_MXFP4_SCALES", "convert")
    assert "MXFP4" not in banner(args)


def test_argument_errors_exit_2_from_the_command_line():
    for args, message in ((("check", "--tokens", "-1"), "--tokens must be >= 1, got -1"),
                          (("precompile", "--shape", "bogus"), "invalid choice: 'bogus'")):
        res = _run(*args)
        assert res.returncode == 2, res.stderr
        assert "Traceback" not in res.stderr
        assert res.stderr.strip().splitlines()[-1].startswith(
            f"python -m nvfp4_ops {args[0]}: error: ")
        assert message in res.stderr


# --- help: the program as invoked, plain text ------------------------------------------------


def _assert_plain(text: str) -> None:
    for markup in ("``", ":func:", ":mod:", ":data:"):
        assert markup not in text, f"raw markup {markup!r} in help:\n{text}"


def test_help_names_python_m():
    res = _run("--help")
    assert res.returncode == 0
    assert res.stdout.startswith("usage: python -m nvfp4_ops ")
    assert "check" in res.stdout and "precompile" in res.stdout
    _assert_plain(res.stdout)
    for command in ("check", "precompile"):
        sub = _run(command, "--help")
        assert sub.returncode == 0
        assert sub.stdout.startswith(f"usage: python -m nvfp4_ops {command} ")
        _assert_plain(sub.stdout)


def test_help_names_the_script():
    """``nvfp4-ops --help`` says ``nvfp4-ops`` (the entry point of pyproject.toml)."""
    script = shutil.which("nvfp4-ops") or os.path.join(os.path.dirname(sys.executable),
                                                       "nvfp4-ops")
    if not os.path.exists(script):
        pytest.skip("the nvfp4-ops script is not installed in this environment")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv, usage in ((["--help"], "usage: nvfp4-ops "),
                        (["check", "--help"], "usage: nvfp4-ops check ")):
        res = subprocess.run([script, *argv], capture_output=True, text=True, timeout=300,
                             env=env, cwd=ROOT)
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith(usage), res.stdout[:200]
        _assert_plain(res.stdout)


def test_program_name():
    from nvfp4_ops.__main__ import program_name

    assert program_name("/venv/bin/nvfp4-ops") == "nvfp4-ops"
    assert program_name("/src/nvfp4_ops/__main__.py") == "python -m nvfp4_ops"
    assert program_name("") == "python -m nvfp4_ops"


# --- importing warns about nothing ----------------------------------------------------------


def test_import_warns_about_nothing():
    """``python -W error -c "import nvfp4_ops"``: torch warns "Failed to initialize NumPy" on
    import when numpy is missing, so numpy is a declared dependency."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split("[")[0].split("=")[0].split(">")[0].strip() == "numpy" for d in deps)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-W", "error", "-c", "import nvfp4_ops"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr == "", res.stderr[-2000:]
