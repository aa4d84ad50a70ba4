"""Every ``NVFP4_OPS_*`` environment switch of the package, read with one rule.

The rule:

* A switch is read when it is used, not when a module is imported, so a test (or a process
  that sets the variable late) sees the current value.
* Values are case-insensitive and surrounding whitespace is ignored; unset or empty means the
  default.
* Anything else raises :class:`NVFP4EnvError` (a ``ValueError``) at that first use, naming the
  variable, the value seen and the accepted spellings. A typo never silently means "default".

Boolean switches (:func:`flag`) accept ``1 / true / yes / on`` and ``0 / false / no / off``.
Three-way switches (:func:`auto_flag`) accept ``auto`` or any boolean spelling.

=========================================  ================================================
Variable                                   Accepted values (default first)
=========================================  ================================================
``NVFP4_OPS_BACKEND``                      ``auto`` | ``reference``: ``reference`` runs the
                                           pure-torch references on CUDA tensors (exact, on
                                           any GPU; slow, and ``moe``'s is not graph-safe)
``NVFP4_OPS_VALUE_CHECKS``                 boolean, default off: per-call checks that read
                                           device data (expert ids, global and block scales;
                                           a host sync each, skipped during CUDA-graph
                                           capture). A debugging aid; weights are checked
                                           once with :func:`nvfp4_ops.check_moe_weights` etc.
``NVFP4_OPS_CACHE_DIR``                    a directory (default ``~/.cache/nvfp4_ops``): the
                                           kernel disk cache; unusable -> memory only, with
                                           one warning; read-only -> loads, never writes
``NVFP4_OPS_DISK_CACHE``                   boolean, default on: off keeps compiled kernels in
                                           memory only
``NVFP4_OPS_NO_COMPILE_AFTER_WARMUP``      boolean, default off: after ``warmup`` any kernel
                                           compile raises ``CompileAfterWarmupError``
``NVFP4_OPS_STREAMK_COUNTERS``             ``reuse`` | ``per-call``: stream-K tile counters
                                           reused per stream / capture, or zeroed per call
``NVFP4_OPS_VLLM``                         boolean, default off: install the vLLM glue
                                           (``model_glue``)
``NVFP4_OPS_MOE_WPERM``                    ``auto`` | boolean: the glue prepares MoE weights
                                           in the ``wperm`` bit order (auto: on CUDA where
                                           the kernels read it)
``NVFP4_OPS_DENSE_WFRAG``                  ``auto`` | boolean: the glue prepares dense
                                           weights in the ``wfrag`` order (auto: on CUDA)
``NVFP4_OPS_MXFP4``                        boolean, default on: the glue runs DeepSeek's
                                           MXFP4 routed experts on ``nvfp4::moe`` (off:
                                           vLLM's own MXFP4 method)
``NVFP4_OPS_MXFP4_SCALES``                 ``auto`` | ``convert`` | ``native``: MXFP4 scales
                                           kept as UE8M0 per 32 k, which the MoE kernels read
                                           natively, or prepared as NVFP4's (e4m3 per 16 k);
                                           auto: native on CUDA at the sizes the ``mx``
                                           kernels cover, converted elsewhere
                                           (:func:`nvfp4_ops.prepare_mxfp4_moe`)
=========================================  ================================================

This module imports nothing of the package (every layer may use it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = [
    "BACKEND",
    "CACHE_DIR",
    "DENSE_WFRAG",
    "DISK_CACHE",
    "MOE_WPERM",
    "MXFP4",
    "MXFP4_SCALES",
    "NO_COMPILE_AFTER_WARMUP",
    "NVFP4EnvError",
    "STREAMK_COUNTERS",
    "VALUE_CHECKS",
    "VLLM",
    "auto_flag",
    "backend",
    "choice",
    "flag",
    "lookup",
    "mxfp4_native",
    "Snapshot",
    "path",
]

BACKEND = "NVFP4_OPS_BACKEND"
VALUE_CHECKS = "NVFP4_OPS_VALUE_CHECKS"
CACHE_DIR = "NVFP4_OPS_CACHE_DIR"
DISK_CACHE = "NVFP4_OPS_DISK_CACHE"
NO_COMPILE_AFTER_WARMUP = "NVFP4_OPS_NO_COMPILE_AFTER_WARMUP"
STREAMK_COUNTERS = "NVFP4_OPS_STREAMK_COUNTERS"
VLLM = "NVFP4_OPS_VLLM"
MOE_WPERM = "NVFP4_OPS_MOE_WPERM"
DENSE_WFRAG = "NVFP4_OPS_DENSE_WFRAG"
MXFP4 = "NVFP4_OPS_MXFP4"
MXFP4_SCALES = "NVFP4_OPS_MXFP4_SCALES"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_BOOL = {**dict.fromkeys(_TRUE, True), **dict.fromkeys(_FALSE, False)}
_BOOL_SPELLINGS = f"{', '.join(_TRUE)} / {', '.join(_FALSE)}"


class NVFP4EnvError(ValueError):
    """An ``NVFP4_OPS_*`` environment variable holds a value its switch does not accept."""


def lookup(name: str) -> str | None:
    """``os.environ.get(name)``, faster on POSIX CPython for the switches the ops read on
    every eager call.

    Why: ``os.environ.get`` of an unset name costs ~1 µs (the mapping raises and catches a
    ``KeyError`` inside), a visible part of an eager op call's host time. ``os.environ`` keeps
    its values in ``_data`` (encoded bytes -> bytes on POSIX, updated in place by every write
    through ``os.environ``, ``monkeypatch.setenv`` and ``mock.patch.dict`` included); a plain
    dict lookup there is ~20x cheaper. Anywhere else (Windows, another Python) the public
    lookup runs.
    """
    data = getattr(os.environ, "_data", None)
    if type(data) is not dict or os.name != "posix":
        return os.environ.get(name)
    value = data.get(_encoded(name))
    return None if value is None else os.fsdecode(value)


class Snapshot:
    """Reads the values of some variables as stored, unparsed (on POSIX CPython their encoded
    bytes; None where unset): equal snapshots mean nothing changed, for a caller that keeps a
    decision made under them (:class:`nvfp4_ops.ops._eager.Repeats`). Cheaper than
    :func:`lookup` per name (no decoding, names encoded once)."""

    __slots__ = ("names", "_encoded")

    def __init__(self, *names: str) -> None:
        self.names = names
        self._encoded = [_encoded(n) for n in names] if os.name == "posix" else None

    def __call__(self) -> tuple:
        data = getattr(os.environ, "_data", None)
        if type(data) is not dict or self._encoded is None:
            return tuple(os.environ.get(n) for n in self.names)
        return tuple(map(data.get, self._encoded))  # no Python frame per name


def _encoded(name: str) -> bytes:
    key = _ENCODED.get(name)
    if key is None:
        key = _ENCODED[name] = os.fsencode(name)
    return key


_ENCODED: dict[str, bytes] = {}


def _raw(name: str) -> tuple[str | None, str]:
    """(the value as set, or None when unset; its normalised form: stripped, lower case)."""
    raw = lookup(name)
    return raw, "" if raw is None else raw.strip().lower()


def _either(words: Sequence[str]) -> str:
    quoted = [f"'{w}'" for w in words]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def flag(name: str, default: bool) -> bool:
    """A boolean switch: ``1/true/yes/on`` -> True, ``0/false/no/off`` -> False, unset or
    empty -> ``default`` (any case, surrounding whitespace ignored).

    Raises:
        NVFP4EnvError: any other value.
    """
    raw, value = _raw(name)
    if not value:
        return default
    hit = _BOOL.get(value)
    if hit is None:
        raise NVFP4EnvError(
            f"{name} must be one of {_BOOL_SPELLINGS}, got {raw!r} (any case; unset or empty "
            f"means {'on' if default else 'off'})"
        )
    return hit


def choice(name: str, choices: Sequence[str], default: str) -> str:
    """A switch with named values: one of ``choices`` (lower-case words), returned in that
    spelling; unset or empty -> ``default`` (any case, surrounding whitespace ignored).

    Raises:
        NVFP4EnvError: any other value.
    """
    raw, value = _raw(name)
    if not value:
        return default
    if value not in choices:
        raise NVFP4EnvError(
            f"{name} must be {_either(choices)}, got {raw!r} (any case; unset or empty means "
            f"{default!r})"
        )
    return value


def auto_flag(name: str) -> bool | None:
    """A three-way switch: ``auto`` (also unset or empty) -> None, a boolean spelling of
    :func:`flag` -> True / False.

    Raises:
        NVFP4EnvError: any other value.
    """
    raw, value = _raw(name)
    if not value or value == "auto":
        return None
    hit = _BOOL.get(value)
    if hit is None:
        raise NVFP4EnvError(
            f"{name} must be 'auto' or one of {_BOOL_SPELLINGS}, got {raw!r} (any case; unset "
            "or empty means 'auto')"
        )
    return hit


def path(name: str) -> str | None:
    """A path switch: the value with surrounding whitespace removed; None when unset or
    empty (the caller's default applies)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return os.path.expanduser(raw.strip())


def backend() -> str:
    """``NVFP4_OPS_BACKEND``: ``"auto"`` (CUDA tensors run the CUDA kernels) or
    ``"reference"`` (they run the pure-torch references, exact on any GPU).

    Raises:
        NVFP4EnvError: any other value.
    """
    return choice(BACKEND, ("auto", "reference"), "auto")


def mxfp4_native() -> bool | None:
    """``NVFP4_OPS_MXFP4_SCALES``: None for ``auto`` (the default: native where the MoE
    kernels read the sizes on CUDA, decided by :func:`nvfp4_ops.prepare_mxfp4_moe`), False for
    ``convert`` (MXFP4 scales prepared as NVFP4's), True for ``native`` (kept as UE8M0 per
    32 k, read by the MoE kernels as they are).

    Raises:
        NVFP4EnvError: any other value.
    """
    value = choice(MXFP4_SCALES, ("auto", "convert", "native"), "auto")
    return None if value == "auto" else value == "native"
