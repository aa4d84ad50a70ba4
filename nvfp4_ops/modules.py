"""``torch.nn`` modules built on the ops: a DeepSeek-V4-style MoE block, and the routed-expert
weights it holds.

Used by the ``check`` CLI, the compile/AOT tests and as an example of calling the ops from a
compiled graph (:func:`nvfp4_ops.testing.random_moe_block` builds one with random weights).
Weights are buffers, so ``torch.export`` and ``aot_compile`` carry them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nvfp4_ops.shapes import MoEShape

__all__ = ["MoEBlock", "QuantizedExperts"]


@dataclass
class QuantizedExperts:
    """Routed-expert tensors in the layout ``nvfp4::moe`` takes (see its docstring)."""

    w13: torch.Tensor  # uint8 [E, 2I, H/2]
    w13_scale: torch.Tensor  # e4m3 [E, 2I, H/16]
    w13_global: torch.Tensor  # fp32 [E, 2]
    w2: torch.Tensor  # uint8 [E, H, I/2]
    w2_scale: torch.Tensor  # e4m3 [E, H, I/16]
    w2_global: torch.Tensor  # fp32 [E]

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.w13, self.w13_scale, self.w13_global, self.w2, self.w2_scale,
                self.w2_global)

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]


class MoEBlock(torch.nn.Module):
    """Router top-k (torch) -> ``nvfp4::moe`` routed experts + ``nvfp4::mlp`` shared expert.

    ``forward(x: bf16 [T, H]) -> bf16 [T, H]``. The router is a bf16 ``[E, H]`` linear with
    softmax scores and top-k; the routed scaling factor is passed to the op as
    ``output_scale``. ``T`` may vary between calls (it is symbolic under ``torch.compile``).
    """

    def __init__(self, shape: MoEShape, experts: QuantizedExperts,
                 shared: tuple[torch.Tensor, ...], router: torch.Tensor):
        """``experts``: the routed experts; ``shared``: the shared expert's ``(w13,
        w13_scale, w13_global, w2, w2_scale, w2_global)`` as ``nvfp4::mlp`` takes them;
        ``router``: ``bf16 [E, H]``."""
        super().__init__()
        self.shape = shape
        self.top_k = shape.top_k
        self.routed_scaling_factor = shape.routed_scaling_factor
        self.swiglu_limit = shape.swiglu_limit
        self.register_buffer("router", router)
        for name, t in zip(("w13", "w13_scale", "w13_global", "w2", "w2_scale", "w2_global"),
                           experts.args(), strict=True):
            self.register_buffer(name, t)
        for name, t in zip(("s13", "s13_scale", "s13_global", "s2", "s2_scale", "s2_global"),
                           shared, strict=True):
            self.register_buffer(name, t)

    @property
    def experts(self) -> QuantizedExperts:
        return QuantizedExperts(self.w13, self.w13_scale, self.w13_global, self.w2,
                                self.w2_scale, self.w2_global)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(topk_ids int32 [T, k], topk_weights fp32 [T, k])``."""
        scores = (x @ self.router.T).float().softmax(dim=-1)
        weights, ids = scores.topk(self.top_k, dim=-1)
        return ids.to(torch.int32), weights

    def routed(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return torch.ops.nvfp4.moe(
            x, ids, weights, self.w13, self.w13_scale, self.w13_global, self.w2,
            self.w2_scale, self.w2_global, 0, self.w13.shape[0], self.swiglu_limit,
            self.routed_scaling_factor,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, weights = self.route(x)
        routed = self.routed(x, ids, weights)
        shared = torch.ops.nvfp4.mlp(x, self.s13, self.s13_scale, self.s13_global, self.s2,
                                     self.s2_scale, self.s2_global, self.swiglu_limit)
        return routed + shared
