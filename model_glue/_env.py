"""Boolean environment switches of the glue, read with one rule.

``flag(name, default)`` accepts ``1/0/true/false/yes/no/on/off`` in any case (surrounding
spaces ignored); unset or empty means ``default``; anything else raises a :class:`ValueError`
naming the variable, at first use. It mirrors ``nvfp4_ops._env.flag`` (same spellings, same
refusal) and is to be replaced by it once that exists.
"""

from __future__ import annotations

import os

__all__ = ["flag"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def flag(name: str, default: bool) -> bool:
    """The boolean value of environment variable ``name`` (``default`` when unset or empty).

    Raises:
        ValueError: any other spelling; the message names the variable and what it accepts.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{name}={raw!r}: expected one of {', '.join(_TRUE + _FALSE)} (any case)")
