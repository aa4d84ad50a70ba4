"""The one torch.library namespace of the package: every op is ``torch.ops.nvfp4.<name>``."""

from __future__ import annotations

NAMESPACE = "nvfp4"


def qualname(name: str) -> str:
    """``"linear"`` -> ``"nvfp4::linear"``."""
    return f"{NAMESPACE}::{name}"
