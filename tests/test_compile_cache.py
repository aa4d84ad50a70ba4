"""CPU tests of the compile machinery (``nvfp4_ops._compile``): disk round trip, corrupt-file
rebuild, fingerprint folders, the no-compile-after-warmup guard. A real (small) CuTeDSL kernel
is compiled, exported and loaded back, so this needs cutlass but no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
pytest.importorskip("cutlass")

import nvfp4_ops  # noqa: E402
from nvfp4_ops import _compile, _warmup  # noqa: E402
from nvfp4_ops.kernels import linear_cuda  # noqa: E402
from nvfp4_ops.kernels.cute import w4a16_gemm  # noqa: E402

CFG = w4a16_gemm.GemmConfig(256, 256, block_m=8, warps_k=2, row_groups=2)


def _tiny_configs():
    return [p.config for p in _warmup.plans_for(_warmup.layers_for_shapes(["tiny"]))]


@pytest.fixture(autouse=True)
def fresh_state(tmp_path, monkeypatch):
    monkeypatch.setenv("NVFP4_OPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NVFP4_OPS_DISK_CACHE", "1")
    _compile.clear_memory_cache()
    _compile.mark_warm(False)
    _compile.set_no_compile_after_warmup(None)
    yield
    _compile.clear_memory_cache()
    _compile.mark_warm(False)
    _compile.set_no_compile_after_warmup(None)


def test_disk_round_trip_loads_without_compiling():
    n0 = _compile.compile_count()
    fn = linear_cuda.compiled(CFG)
    assert _compile.compile_count() == n0 + 1
    path = _compile.cache_dir() / f"{CFG.name}.o"
    assert path.exists() and path.stat().st_size > 1000
    assert not list(path.parent.glob("*.tmp.o")), "temporary file left behind"
    assert linear_cuda.compiled(CFG) is fn  # memory hit
    _compile.clear_memory_cache()
    with _compile.no_compile():  # a disk hit is a load, not a compile
        loaded = linear_cuda.compiled(CFG)
    assert _compile.compile_count() == n0 + 1
    assert loaded is not fn and callable(loaded)


def test_corrupt_file_is_rebuilt(capsys):
    linear_cuda.compiled(CFG)
    path = _compile.cache_dir() / f"{CFG.name}.o"
    path.write_bytes(b"not an object file")
    _compile.clear_memory_cache()
    n0 = _compile.compile_count()
    fn = linear_cuda.compiled(CFG)
    assert callable(fn)
    assert _compile.compile_count() == n0 + 1
    assert "rebuilding" in capsys.readouterr().err
    assert path.stat().st_size > 1000
    _compile.clear_memory_cache()
    with _compile.no_compile():
        linear_cuda.compiled(CFG)  # the rebuilt file loads


def test_disk_cache_can_be_disabled(monkeypatch, tmp_path):
    monkeypatch.setenv("NVFP4_OPS_DISK_CACHE", "0")
    assert _compile.cache_dir() is None
    linear_cuda.compiled(CFG)
    assert not (tmp_path / "cache").exists()


def test_fingerprint_changes_with_each_input():
    base = _compile.fingerprint_inputs()
    fp = _compile.fingerprint(base)
    assert fp == _compile.fingerprint(dict(base))
    for key in ("sources", "cutlass_dsl", "tvm_ffi", "arch", "host"):
        changed = dict(base, **{key: base[key] + "x"})
        assert _compile.fingerprint(changed) != fp, key
    assert _compile.cache_dir().name == fp


def test_fingerprint_follows_package_sources(tmp_path):
    """A changed source file gives a new cache folder (checked on a copy of the package)."""
    import shutil

    pkg = tmp_path / "copy" / "nvfp4_ops"
    shutil.copytree(os.path.dirname(_compile.__file__), pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    before = _compile.fingerprint(_compile.fingerprint_inputs(pkg))
    assert before == _compile.fingerprint()  # same sources -> same folder
    (pkg / "format.py").write_text((pkg / "format.py").read_text() + "\n# changed\n")
    assert _compile.fingerprint(_compile.fingerprint_inputs(pkg)) != before


def test_guard_raises_on_compile_after_warmup():
    linear_cuda.compiled(CFG)  # "warmed" variant
    _compile.mark_warm(True)
    _compile.set_no_compile_after_warmup(True)
    other = w4a16_gemm.GemmConfig(256, 256, block_m=16, warps_k=2, row_groups=2)
    with pytest.raises(_compile.CompileAfterWarmupError, match=other.name):
        linear_cuda.compiled(other)
    assert callable(linear_cuda.compiled(CFG))  # warmed variants still served
    _compile.set_no_compile_after_warmup(False)
    assert callable(linear_cuda.compiled(other))


def test_guard_env_var_and_warmup_cpu(monkeypatch):
    monkeypatch.setenv("NVFP4_OPS_NO_COMPILE_AFTER_WARMUP", "1")
    names = nvfp4_ops.warmup(["tiny"], run=False)
    # 4 GEMM problems x 6 token tiles, plus the persistent decode gate/up (few token tiles),
    # plus the wfrag + wperm twins of the 2 dense (MLP) problems x 6 tiles
    assert len(names) == 25 + 12 and _compile.is_warm()
    _compile.clear_memory_cache()
    for cfg in _tiny_configs():
        linear_cuda.compiled(cfg)  # all from disk: no error
    with pytest.raises(_compile.CompileAfterWarmupError):
        linear_cuda.compiled(w4a16_gemm.GemmConfig(512, 256, block_m=8, warps_k=2,
                                                   row_groups=2))


def test_package_import_does_not_import_cutlass():
    code = textwrap.dedent("""
        import sys, nvfp4_ops
        assert callable(nvfp4_ops.warmup)
        bad = [m for m in sys.modules if m.startswith(("cutlass", "triton"))]
        assert not bad, bad
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


def test_precompile_jobs_fills_the_disk_cache(tmp_path):
    """``precompile --jobs 2``: worker processes compile every variant into the disk cache
    (the summary counts their compiles); a second, serial precompile then compiles nothing."""
    env = dict(os.environ, NVFP4_OPS_CACHE_DIR=str(tmp_path / "jobs_cache"))
    cmd = [sys.executable, "-m", "nvfp4_ops", "precompile", "--shape", "tiny", "--no-run"]
    first = subprocess.run(cmd + ["--jobs", "2"], env=env, capture_output=True, text=True,
                           timeout=900)
    assert first.returncode == 0, first.stderr[-2000:]
    total = len(_tiny_configs())
    assert f"{total} compiled by 2 workers" in first.stdout
    ready = f"{total} CuTeDSL variants ready"
    assert f"{ready} ({total} compiled, 0 from the disk cache)" in first.stdout
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"{ready} (0 compiled, {total} from the disk cache)" in second.stdout
    bad = subprocess.run(cmd + ["--jobs", "0"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "--jobs must be >= 1" in bad.stderr


def test_precompile_jobs_falls_back_to_one_process(monkeypatch, capsys):
    """If the worker pool fails, precompile says so and compiles in its own process."""
    from nvfp4_ops.cli import precompile

    def broken(*args):
        raise RuntimeError("no workers here")

    monkeypatch.setattr(precompile, "_compile_parallel", broken)
    assert precompile.main(["--shape", "tiny", "--no-run", "--jobs", "2"]) == 0
    captured = capsys.readouterr()
    assert "compile workers failed (RuntimeError: no workers here)" in captured.err
    total = len(_tiny_configs())
    assert f"{total} CuTeDSL variants ready" in captured.out
