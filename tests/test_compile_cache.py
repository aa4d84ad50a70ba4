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
    # 2 dense (MLP) GEMM problems x 6 token tiles and 2 MoE ones x the policy's 5
    # (dispatch.MOE_POLICY_TILES), plus the persistent decode gate/up (few token tiles), plus
    # the wfrag + wperm twins of the 2 dense problems x 6 tiles, plus the 2 MoE GEMMs' base
    # tiles that run beside a hot tile (16, 64, 128: 3 tiles)
    assert len(names) == 2 * 6 + 2 * 5 + 1 + 12 + 2 * 3 and _compile.is_warm()
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


# --- disk-cache robustness, with the injectable build / export / load hooks (no compiler) ---


class _Key:
    """A stand-in compile key: hashable, with a C-identifier ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Key) and other.name == self.name


class _Hooks:
    """build / export / load that write and read a small payload, counting each call."""

    def __init__(self) -> None:
        self.builds = self.exports = self.loads = 0

    def build(self, name: str):
        def make():
            self.builds += 1
            return f"binary:{name}"
        return make

    def export(self, compiled, path, symbol):
        self.exports += 1
        with open(path, "wb") as fh:
            fh.write(f"{compiled}|{symbol}".encode() * 64)

    def load(self, path, symbol):
        self.loads += 1
        with open(path, "rb") as fh:
            data = fh.read()
        assert data.endswith(f"|{symbol}".encode())
        return f"loaded:{symbol}"

    def get(self, name: str):
        return _compile.get_compiled(_Key(name), self.build(name), export=self.export,
                                     load=self.load)


@pytest.fixture
def fresh_cache_warnings(monkeypatch):
    """Each test starts with no warnings or reports given and no folder marked read-only."""
    monkeypatch.setattr(_compile, "_warned", set())
    monkeypatch.setattr(_compile, "_reported", set())
    monkeypatch.setattr(_compile, "_unwritable", set())


def _cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)
            and "NVFP4_OPS_CACHE_DIR" in str(w.message)]


def test_hooks_round_trip_writes_a_checksum(fresh_cache_warnings):
    hooks = _Hooks()
    assert hooks.get("k_round_trip") == "binary:k_round_trip"
    folder = _compile.cache_dir()
    obj, side = folder / "k_round_trip.o", folder / "k_round_trip.sha256"
    digest, fname = side.read_text().split()
    assert fname == "k_round_trip.o"
    import hashlib

    assert digest == hashlib.sha256(obj.read_bytes()).hexdigest()
    assert not list(folder.glob("*.tmp.*")), "temporary file left behind"
    _compile.clear_memory_cache()
    assert hooks.get("k_round_trip") == "loaded:k_round_trip"
    assert (hooks.builds, hooks.exports, hooks.loads) == (1, 1, 1)


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "no sidecar", "bad sidecar"])
def test_checksum_mismatch_rebuilds_and_reports_once(fresh_cache_warnings, capsys, damage):
    hooks = _Hooks()
    hooks.get("k_sum")
    folder = _compile.cache_dir()
    obj, side = folder / "k_sum.o", folder / "k_sum.sha256"
    data = bytearray(obj.read_bytes())
    if damage == "flip a byte":
        data[len(data) // 2] ^= 0x01  # still loads with the test's loader: only the sum sees it
        obj.write_bytes(bytes(data))
    elif damage == "truncate":
        obj.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "no sidecar":
        side.unlink()
    else:
        side.write_text("0" * 64 + "  k_sum.o\n")
    _compile.clear_memory_cache()
    assert hooks.get("k_sum") == "binary:k_sum"  # rebuilt, never loaded
    assert (hooks.builds, hooks.loads) == (2, 0)
    err = capsys.readouterr().err
    assert err.count("rebuilding cache file") == 1 and str(obj) in err
    _compile.clear_memory_cache()
    assert hooks.get("k_sum") == "loaded:k_sum"  # the rebuilt file and its new sum agree
    assert "rebuilding" not in capsys.readouterr().err


def test_cache_dir_that_is_a_file_means_memory_only_with_one_warning(
        fresh_cache_warnings, tmp_path, monkeypatch):
    not_a_dir = tmp_path / "cache_file"
    not_a_dir.write_text("I am a file")
    monkeypatch.setenv("NVFP4_OPS_CACHE_DIR", str(not_a_dir))
    hooks = _Hooks()
    import warnings

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert _compile.cache_dir() is None
        assert hooks.get("k_file_a") == "binary:k_file_a"
        assert hooks.get("k_file_b") == "binary:k_file_b"
    msgs = _cache_warnings(record)
    assert len(msgs) == 1, msgs
    assert str(not_a_dir) in msgs[0] and "memory" in msgs[0]
    assert hooks.exports == 0 and not_a_dir.read_text() == "I am a file"


def test_cache_dir_under_a_file_means_memory_only(fresh_cache_warnings, tmp_path, monkeypatch):
    (tmp_path / "f").write_text("")
    monkeypatch.setenv("NVFP4_OPS_CACHE_DIR", str(tmp_path / "f" / "sub"))
    with pytest.warns(RuntimeWarning, match="NVFP4_OPS_CACHE_DIR"):
        assert _Hooks().get("k_under_file") == "binary:k_under_file"


def _populate(names) -> _Hooks:
    hooks = _Hooks()
    for name in names:
        hooks.get(name)
    for lock in _compile.cache_dir().glob("*.lock"):
        lock.unlink()  # a cache copied elsewhere, or made by another user: no lock files
    _compile.clear_memory_cache()
    return hooks


def test_read_only_populated_cache_loads_without_a_lock(fresh_cache_warnings, monkeypatch):
    """Loading an existing binary needs no lock file and no write access."""
    hooks = _populate(["k_ro_a", "k_ro_b"])

    def no_writes(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(_compile, "_open_lock_file", no_writes)
    import warnings

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert hooks.get("k_ro_a") == "loaded:k_ro_a"
        assert hooks.get("k_ro_b") == "loaded:k_ro_b"
    assert not _cache_warnings(record)
    assert hooks.builds == 2 and not list(_compile.cache_dir().glob("*.lock"))


def test_read_only_cache_compiles_misses_into_memory_with_one_warning(
        fresh_cache_warnings, monkeypatch):
    hooks = _populate(["k_ro_have"])

    def no_writes(path):
        raise OSError(30, "Read-only file system", str(path))

    monkeypatch.setattr(_compile, "_open_lock_file", no_writes)
    import warnings

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert hooks.get("k_ro_miss1") == "binary:k_ro_miss1"
        assert hooks.get("k_ro_miss2") == "binary:k_ro_miss2"
        assert hooks.get("k_ro_have") == "loaded:k_ro_have"
    msgs = _cache_warnings(record)
    assert len(msgs) == 1, msgs
    assert "cannot write" in msgs[0]
    assert hooks.exports == 1  # only the populating one
    assert not (_compile.cache_dir() / "k_ro_miss1.o").exists()


def test_export_that_fails_with_os_error_keeps_the_binary(fresh_cache_warnings):
    hooks = _Hooks()

    def full_disk(compiled, path, symbol):
        raise OSError(28, "No space left on device", path)

    with pytest.warns(RuntimeWarning, match=r"cannot write .*No space left.*NVFP4_OPS_CACHE_DIR"):
        fn = _compile.get_compiled(_Key("k_full"), hooks.build("k_full"), export=full_disk,
                                   load=hooks.load)
    assert fn == "binary:k_full"
    folder = _compile.cache_dir()
    assert not list(folder.glob("k_full*.o")) and not list(folder.glob("*.tmp.*"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_directory_by_permissions(fresh_cache_warnings):
    hooks = _populate(["k_perm"])
    folder = _compile.cache_dir()
    folder.chmod(0o555)
    try:
        assert hooks.get("k_perm") == "loaded:k_perm"
        with pytest.warns(RuntimeWarning, match="NVFP4_OPS_CACHE_DIR"):
            assert hooks.get("k_perm_new") == "binary:k_perm_new"
    finally:
        folder.chmod(0o755)


def test_disk_cache_switch_spellings(monkeypatch):
    for off in ("0", "off", "False", "no"):
        monkeypatch.setenv("NVFP4_OPS_DISK_CACHE", off)
        assert _compile.cache_dir() is None, off
    monkeypatch.setenv("NVFP4_OPS_DISK_CACHE", "on")
    assert _compile.cache_dir() is not None
    monkeypatch.setenv("NVFP4_OPS_DISK_CACHE", "sometimes")
    with pytest.raises(ValueError, match="NVFP4_OPS_DISK_CACHE must be one of .* got 'sometimes'"):
        _compile.cache_dir()


@pytest.mark.parametrize("on", ["1", "true", "YES", "on"])
def test_guard_switch_spellings(monkeypatch, on):
    monkeypatch.setenv("NVFP4_OPS_NO_COMPILE_AFTER_WARMUP", on)
    assert _compile._guard_on()
    monkeypatch.setenv("NVFP4_OPS_NO_COMPILE_AFTER_WARMUP", "maybe")
    with pytest.raises(ValueError, match="NVFP4_OPS_NO_COMPILE_AFTER_WARMUP must be"):
        _compile._guard_on()


def test_precompile_with_an_unusable_cache_dir(fresh_cache_warnings, tmp_path, monkeypatch,
                                               capsys):
    """``precompile`` with ``NVFP4_OPS_CACHE_DIR`` naming a file: one warning, memory only,
    exit 0 (warm-up stubbed with the test hooks: no compiler needed); ``--jobs`` refuses in
    one line, naming the variable."""
    import warnings

    import nvfp4_ops
    from nvfp4_ops.cli import precompile

    not_a_dir = tmp_path / "cache_file"
    not_a_dir.write_text("")
    monkeypatch.setenv("NVFP4_OPS_CACHE_DIR", str(not_a_dir))
    hooks = _Hooks()

    def warmup(shapes, *, run, include_moe, progress):
        names = [f"k_pre_{i}" for i in range(3)]
        for name in names:
            hooks.get(name)
            progress(name)
        return names

    monkeypatch.setattr(nvfp4_ops, "warmup", warmup)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert precompile.main(["--shape", "tiny", "--no-run"]) == 0
    assert len(_cache_warnings(record)) == 1
    out = capsys.readouterr().out
    assert "cache memory only" in out and hooks.builds == 3 and hooks.exports == 0
    with pytest.raises(SystemExit) as info:
        precompile.main(["--shape", "tiny", "--no-run", "--jobs", "2"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--jobs needs the disk cache (the folder under NVFP4_OPS_CACHE_DIR" in err
    assert "Traceback" not in err
