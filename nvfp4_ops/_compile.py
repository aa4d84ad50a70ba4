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
never loaded.

Disk cache rules:

* Every ``<name>.o`` has a sidecar ``<name>.sha256`` (``sha256sum`` format) written before the
  object is published; a file whose bytes do not match (or that fails to load) is reported
  once on stderr and rebuilt, so flipped bytes are never loaded.
* Reading needs no lock and no write access (publishing is an atomic rename): a read-only,
  fully populated cache loads. Writers take a per-key ``fcntl`` lock, look again under it
  (another process may have just published the key), compile and publish.
* A cache folder that cannot be created or used (``NVFP4_OPS_CACHE_DIR`` naming a file, an
  unwritable parent) means memory only, with one warning naming ``NVFP4_OPS_CACHE_DIR``; a
  folder that refuses writes (read-only) still serves what it holds, and kernels compiled
  beyond that stay in memory (one warning).

Environment (read at use; the spellings of :mod:`nvfp4_ops._env`):

* ``NVFP4_OPS_CACHE_DIR``: cache root (default ``~/.cache/nvfp4_ops``).
* ``NVFP4_OPS_DISK_CACHE`` (boolean, default on): off means no disk cache (memory only).
* ``NVFP4_OPS_NO_COMPILE_AFTER_WARMUP`` (boolean, default off): after
  :func:`nvfp4_ops.warmup`, any compile raises :class:`CompileAfterWarmupError` (also
  :func:`set_no_compile_after_warmup`). Loading from the disk cache is not a compile and stays
  allowed.

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
import warnings
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

from nvfp4_ops import _env

__all__ = [
    "cache_dir",
    "clear_memory_cache",
    "compile_count",
    "CompileAfterWarmupError",
    "ensure_cutlass_env",
    "fingerprint",
    "get_compiled",
    "is_warm",
    "mark_warm",
    "memory_generation",
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
_state: dict[str, Any] = {"warm": False, "guard": None, "compiles": 0, "forbid": 0,
                         "generation": 0}


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


def cache_root() -> Path:
    """``NVFP4_OPS_CACHE_DIR``, else ``~/.cache/nvfp4_ops`` (the folder above the fingerprint
    folders)."""
    root = _env.path(_env.CACHE_DIR)
    return Path(root) if root else Path.home() / ".cache" / "nvfp4_ops"


#: Problems already warned about (one warning per problem and folder per process).
_warned: set[str] = set()
#: Cache files already reported as corrupt on stderr (one report per file per process).
_reported: set[str] = set()
#: Folders that refused a write: later misses compile into memory without trying again.
_unwritable: set[Path] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _folder_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot serve as the cache folder, or None (it exists or was created)."""
    try:
        if folder.is_dir():
            return None
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None


def cache_dir() -> Path | None:
    """``<root>/<fingerprint>`` (created if missing), or None for memory only: when
    ``NVFP4_OPS_DISK_CACHE`` is off, or when the folder cannot be created or used (then one
    ``RuntimeWarning`` names ``NVFP4_OPS_CACHE_DIR``).

    Raises:
        nvfp4_ops._env.NVFP4EnvError: ``NVFP4_OPS_DISK_CACHE`` holds something else than a
            boolean spelling.
    """
    if not _env.flag(_env.DISK_CACHE, True):
        return None
    folder = cache_root() / _fingerprint_cached(target_arch())
    problem = _folder_problem(folder)
    if problem is not None:
        _warn_once(f"unusable:{folder}", (
            f"nvfp4_ops: the kernel cache folder {folder} cannot be used ({problem}); "
            f"compiled kernels stay in memory for this process. Point {_env.CACHE_DIR} at a "
            f"writable directory (or set {_env.DISK_CACHE}=0 to go without a disk cache)."))
        return None
    return folder


def _guard_on() -> bool:
    if _state["guard"] is not None:
        return bool(_state["guard"])
    return _env.flag(_env.NO_COMPILE_AFTER_WARMUP, False)


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
        _state["generation"] += 1


def memory_generation() -> int:
    """How many times :func:`clear_memory_cache` ran: a caller that keeps binaries of its own
    (keyed without hashing the config) drops them when this changes."""
    return _state["generation"]


def _open_lock_file(path: Path):
    """The lock file, opened for locking (a seam: tests replace it to act as a read-only
    folder even when they run as root)."""
    return open(path, "a+")  # noqa: SIM115 - closed by _file_lock


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[bool]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (created if missing) while the block runs.

    Yields False, holding nothing, when the lock file cannot be created or opened (a
    read-only or vanished folder): the caller must not write then. On a file system without
    ``flock`` it yields True unlocked: publishing by atomic rename keeps readers safe, and
    two writers only compile the same key twice.
    """
    try:
        fh = _open_lock_file(path)
    except OSError:
        fh = None
    if fh is None:
        yield False
        return
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            locked = True
        except OSError:
            locked = False
        try:
            yield True
        finally:
            if locked:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _default_export(compiled: Any, path: str, symbol: str) -> None:
    compiled.export_to_c(path, function_name=symbol)


def _default_load(path: str, symbol: str) -> Callable:
    ensure_cutlass_env()
    import cutlass.cute as cute

    module = cute.runtime.load_module(path, enable_tvm_ffi=True)
    return getattr(module, symbol)


def checksum_path(path: Path) -> Path:
    """The sidecar of cache file ``<name>.o``: ``<name>.sha256``."""
    return path.with_suffix(".sha256")


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _checksum_problem(path: Path) -> str | None:
    """None when ``path``'s bytes match its sidecar, else what is wrong."""
    try:
        recorded = checksum_path(path).read_text().split()
    except FileNotFoundError:
        return f"its checksum file {checksum_path(path).name} is missing"
    except OSError as exc:
        return f"its checksum file cannot be read ({exc})"
    actual = _sha256(path)
    if not recorded or recorded[0] != actual:
        seen = recorded[0][:16] if recorded else "nothing"
        return f"sha256 {actual[:16]}... differs from the recorded {seen}..."
    return None


def _try_load(path: Path, name: str, load: Callable[[str, str], Callable]) -> Callable | None:
    """The binary at ``path`` if it is there, matches its checksum and loads; else None (a
    bad file is reported once on stderr; the caller rebuilds it)."""
    try:
        if not path.is_file():
            return None
        problem = _checksum_problem(path)
    except OSError as exc:
        problem = f"it cannot be read ({exc})"
    if problem is None:
        try:
            return load(str(path), name)
        except Exception as exc:  # noqa: BLE001 - any load failure means rebuild
            problem = f"it does not load ({type(exc).__name__}: {exc})"
    if str(path) not in _reported:
        _reported.add(str(path))
        print(f"nvfp4_ops: rebuilding cache file {path}: {problem}", file=sys.stderr)
    return None


def _refuse_writes(folder: Path, why: str) -> None:
    _unwritable.add(folder)
    _warn_once(f"readonly:{folder}", (
        f"nvfp4_ops: cannot write to the kernel cache folder {folder} ({why}); binaries it "
        f"holds still load, kernels compiled from now on stay in memory for this process. "
        f"Point {_env.CACHE_DIR} at a writable directory to keep them."))


def _publish(compiled: Any, folder: Path, path: Path, name: str,
             export: Callable[[Any, str, str], None]) -> None:
    """Export ``compiled`` to ``path`` with its checksum sidecar: both written to temporary
    names, then renamed, sidecar first (so a published ``.o`` always has one). A folder that
    refuses the write is marked read-only (one warning); the binary stays in memory."""
    tmp = path.with_name(f"{name}.{os.getpid()}.tmp.o")
    tmp_sum = path.with_name(f"{name}.{os.getpid()}.tmp.sha256")
    try:
        export(compiled, str(tmp), name)
        tmp_sum.write_text(f"{_sha256(tmp)}  {path.name}\n")
        os.replace(tmp_sum, checksum_path(path))
        os.replace(tmp, path)
    except OSError as exc:
        _refuse_writes(folder, f"{type(exc).__name__}: {exc.strerror or exc}")
    finally:
        for leftover in (tmp, tmp_sum):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)


def _from_disk(key: Hashable, folder: Path, build: Callable[[], Any],
               export: Callable[[Any, str, str], None],
               load: Callable[[str, str], Callable]) -> Callable:
    name = key.name  # type: ignore[attr-defined]
    path = folder / f"{name}.o"
    fn = _try_load(path, name, load)  # no lock: a published file is complete
    if fn is not None:
        return fn
    if folder in _unwritable:
        return _build(key, build)
    with _file_lock(folder / f"{name}.lock") as may_write:
        if not may_write:
            _refuse_writes(folder, "its lock file cannot be created")
            return _build(key, build)
        fn = _try_load(path, name, load)  # another process may have published it meanwhile
        if fn is not None:
            return fn
        compiled = _build(key, build)
        _publish(compiled, folder, path, name, export)
        return compiled


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
        folder = cache_dir()
        if folder is None:
            fn = _build(key, build)
        else:
            fn = _from_disk(key, folder, build, export, load)
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
