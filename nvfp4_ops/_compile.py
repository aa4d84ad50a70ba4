"""Compile keys, the in-memory + on-disk cache of CuTeDSL binaries, and the no-compile guard.

A *key* is a frozen dataclass holding only what changes the generated code (dtypes, tile
config, static N/K, epilogue, arch; e.g. :class:`nvfp4_ops.kernels.cute.w4a16_gemm.GemmConfig`)
and a ``name`` property that is a valid C identifier. Token counts are symbolic in every
binary, so a key serves every batch size.

Lookup order for a key: the in-memory dict, then ``<cache dir>/<fingerprint>/<name>.o`` (an
object exported with ``export_to_c`` and loaded with
``cute.runtime.load_module(..., enable_tvm_ffi=True)``), then a fresh compile (exported to disk
for the next process). The fingerprint folder changes whenever the package sources, the
cutlass-dsl or tvm-ffi versions, the target arch or the host CPU change, so a stale binary is
never loaded. Writers take a per-key ``fcntl`` lock and publish with an atomic rename; a file
that fails to load is deleted and rebuilt.

Environment:

* ``NVFP4_OPS_CACHE_DIR``: cache root (default ``~/.cache/nvfp4_ops``).
* ``NVFP4_OPS_DISK_CACHE=0``: no disk cache (memory only).
* ``NVFP4_OPS_NO_COMPILE_AFTER_WARMUP=1``: after :func:`nvfp4_ops.warmup`, any compile raises
  :class:`CompileAfterWarmupError` (also :func:`set_no_compile_after_warmup`). Loading from the
  disk cache is not a compile and stays allowed.

This module imports nothing else of the package (warm-up, which needs the dispatch, lives in
:mod:`nvfp4_ops.warmup`); cutlass is imported inside functions only.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import os
import platform
import sys
import threading
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "CompileAfterWarmupError",
    "cache_dir",
    "clear_memory_cache",
    "compile_count",
    "fingerprint",
    "get_compiled",
    "is_warm",
    "no_compile",
    "set_no_compile_after_warmup",
    "target_arch",
]

_PACKAGE_ROOT = Path(__file__).resolve().parent
DEFAULT_ARCH = "sm_90a"


class CompileAfterWarmupError(RuntimeError):
    """A kernel had to be compiled after :func:`warmup` while the guard was on."""


_memory: dict[Hashable, Callable] = {}
_lock = threading.RLock()
_state: dict[str, Any] = {"warm": False, "guard": None, "compiles": 0, "forbid": 0}


def target_arch() -> str:
    """The arch binaries are built for: ``CUTE_DSL_ARCH`` if set, else ``sm_90a``."""
    return os.environ.get("CUTE_DSL_ARCH", DEFAULT_ARCH)


def ensure_cutlass_env() -> None:
    """Set ``CUTE_DSL_ARCH`` before cutlass is imported, so compiling needs no GPU/driver."""
    os.environ.setdefault("CUTE_DSL_ARCH", DEFAULT_ARCH)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _host_cpu() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{platform.machine()}|{model}"


def fingerprint_inputs(package_root: Path | None = None) -> dict[str, str]:
    """What the cache folder name hashes (exposed for tests and debugging)."""
    root = _PACKAGE_ROOT if package_root is None else Path(package_root)
    src = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        src.update(str(path.relative_to(root)).encode())
        src.update(path.read_bytes())
    return {
        "sources": src.hexdigest(),
        "cutlass_dsl": _version("nvidia-cutlass-dsl"),
        "tvm_ffi": _version("apache-tvm-ffi"),
        "arch": target_arch(),
        "host": _host_cpu(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def fingerprint(inputs: dict[str, str] | None = None) -> str:
    """Short hash of :func:`fingerprint_inputs` (the cache sub-folder name)."""
    inputs = fingerprint_inputs() if inputs is None else inputs
    blob = "\n".join(f"{k}={v}" for k, v in sorted(inputs.items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


@functools.cache
def _fingerprint_cached(arch: str) -> str:
    return fingerprint()


def cache_dir() -> Path | None:
    """``<root>/<fingerprint>``, or None when ``NVFP4_OPS_DISK_CACHE=0``."""
    if os.environ.get("NVFP4_OPS_DISK_CACHE", "1") == "0":
        return None
    root = os.environ.get("NVFP4_OPS_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "nvfp4_ops"
    )
    return Path(root) / _fingerprint_cached(target_arch())


def _guard_on() -> bool:
    if _state["guard"] is not None:
        return bool(_state["guard"])
    return os.environ.get("NVFP4_OPS_NO_COMPILE_AFTER_WARMUP", "0") == "1"


def set_no_compile_after_warmup(enabled: bool | None) -> None:
    """Turn the guard on/off (None: follow ``NVFP4_OPS_NO_COMPILE_AFTER_WARMUP``)."""
    _state["guard"] = enabled


def is_warm() -> bool:
    return bool(_state["warm"])


def compile_count() -> int:
    """How many compiles this process has done (tests use it to prove a disk hit)."""
    return int(_state["compiles"])


@contextlib.contextmanager
def no_compile() -> Iterator[None]:
    """Inside this block any compile raises (loads from memory/disk stay allowed)."""
    _state["forbid"] += 1
    try:
        yield
    finally:
        _state["forbid"] -= 1


def clear_memory_cache() -> None:
    """Forget in-memory binaries (tests; the disk cache is untouched)."""
    with _lock:
        _memory.clear()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _default_export(compiled: Any, path: str, symbol: str) -> None:
    compiled.export_to_c(path, function_name=symbol)


def _default_load(path: str, symbol: str) -> Callable:
    ensure_cutlass_env()
    import cutlass.cute as cute

    module = cute.runtime.load_module(path, enable_tvm_ffi=True)
    return getattr(module, symbol)


def get_compiled(
    key: Hashable,
    build: Callable[[], Any],
    *,
    export: Callable[[Any, str, str], None] = _default_export,
    load: Callable[[str, str], Callable] = _default_load,
) -> Callable:
    """The callable binary for ``key``: memory, else disk, else ``build()`` (then saved).

    Args:
        key: hashable, with a ``name`` attribute usable as a C symbol and file name.
        build: compiles the key (returns a CuTeDSL compiled function).
        export / load: how a binary goes to / comes from disk (overridable for tests).

    Raises:
        CompileAfterWarmupError: a compile was needed while the guard forbids it.
    """
    fn = _memory.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _memory.get(key)
        if fn is not None:
            return fn
        name = key.name  # type: ignore[attr-defined]
        folder = cache_dir()
        if folder is None:
            fn = _build(key, build)
        else:
            path = folder / f"{name}.o"
            with _file_lock(folder / f"{name}.lock"):
                if path.exists():
                    try:
                        fn = load(str(path), name)
                    except Exception as exc:  # corrupt or truncated file: rebuild it
                        print(f"nvfp4_ops: rebuilding unreadable cache file {path}: {exc}",
                              file=sys.stderr)
                        path.unlink(missing_ok=True)
                        fn = None
                if fn is None:
                    compiled = _build(key, build)
                    tmp = path.with_name(f"{name}.{os.getpid()}.tmp.o")
                    try:
                        export(compiled, str(tmp), name)
                        os.replace(tmp, path)
                    finally:
                        tmp.unlink(missing_ok=True)
                    fn = compiled
        _memory[key] = fn
        return fn


def _build(key: Hashable, build: Callable[[], Any]) -> Any:
    if _state["forbid"] or (_state["warm"] and _guard_on()):
        raise CompileAfterWarmupError(
            f"nvfp4_ops: kernel {getattr(key, 'name', key)!r} needs a compile after warmup; "
            "add its layer or shape to nvfp4_ops.warmup(...) (or unset "
            "NVFP4_OPS_NO_COMPILE_AFTER_WARMUP)"
        )
    ensure_cutlass_env()
    _state["compiles"] += 1
    return build()


def mark_warm(warm: bool = True) -> None:
    """Record that warm-up finished (the guard only bites after this)."""
    _state["warm"] = warm
