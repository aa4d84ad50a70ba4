"""Table entries that go with the tensors they were built from (no package imports).

Two host-side memos key entries by the ``id`` of tensor objects and must drop an entry the
moment one of those tensors is freed (else a later object with a recycled ``id`` could find
it, and the entry would keep what it holds alive): the weights' kernel-form views
(:func:`nvfp4_ops.kernels.linear_cuda.memo_views`) and the kept launches
(:class:`nvfp4_ops.ops._eager.Repeats`). Each entry is a tuple whose first item is the
references :func:`entry_refs` returns.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Hashable, Iterable

__all__ = ["entry_refs"]


def entry_refs(table: dict, key: Hashable, tensors: Iterable[object]) -> tuple[weakref.ref, ...]:
    """Weak references to ``tensors`` (None entries skipped) that delete ``table[key]`` when
    one of them dies, unless a newer entry that still has all its tensors took the key. The
    callback holds the table itself, not a module global, so it also runs at exit."""
    forget = functools.partial(_forget, table, key)
    return tuple(weakref.ref(t, forget) for t in tensors if t is not None)


def _forget(table: dict, key: Hashable, _dead: weakref.ref) -> None:
    entry = table.get(key)
    if entry is not None and any(r() is None for r in entry[0]):
        del table[key]
