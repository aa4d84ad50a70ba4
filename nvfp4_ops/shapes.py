"""Named layer shapes: DeepSeek-V4 Flash and Pro, and a tiny one for quick CPU runs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MoEShape", "SHAPES", "get_shape"]


@dataclass(frozen=True)
class MoEShape:
    """One DeepSeek-V4 MoE layer.

    ``hidden`` H, ``intermediate`` I (size of gate *or* up, per routed expert), ``experts``
    E routed experts, ``top_k`` k, ``shared_intermediate`` the shared expert's I.
    """

    name: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    shared_intermediate: int
    routed_scaling_factor: float
    swiglu_limit: float


SHAPES: dict[str, MoEShape] = {
    s.name: s
    for s in (
        MoEShape("v4-flash", 4096, 2048, 256, 6, 2048, 1.5, 10.0),
        MoEShape("v4-pro", 7168, 3072, 384, 6, 3072, 2.5, 10.0),
        MoEShape("tiny", 256, 128, 16, 6, 128, 1.5, 10.0),
    )
}


def get_shape(name: str) -> MoEShape:
    """Look a shape up by name; the error lists the known names."""
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}") from None
