"""Random NVFP4 weights and error metrics, shared by the tests, the benchmarks and the CLI.

Everything is generated on the target device from torch's global RNG (seed it with
``torch.manual_seed``), so GPU runs do not pay for CPU generation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from nvfp4_ops import format as fmt

__all__ = [
    "QuantizedExperts",
    "find_cuda_tool",
    "kernel_ptx",
    "moe_bf16_dequantized",
    "planned_gemm",
    "random_experts",
    "random_nvfp4",
    "random_routing",
    "rel_l2",
]

WEIGHT_STD = 0.02


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


def random_nvfp4(rows: int, k: int, *, device: str | torch.device = "cpu",
                 std: float = WEIGHT_STD) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize a fresh Gaussian bf16 matrix ``[rows, k]``: ``(packed, scale, global [])``."""
    w = (torch.randn(rows, k, device=device) * std).to(torch.bfloat16)
    return fmt.quantize(w)


def random_experts(num_experts: int, hidden: int, inter: int, *,
                   device: str | torch.device = "cpu", up_scale_ratio: float = 1.0,
                   progress: Callable[[int, int], None] | None = None) -> QuantizedExperts:
    """Quantize ``num_experts`` random experts one at a time (peak memory: one bf16 expert).

    Gate, up and down are quantized separately, so each keeps its own global scale;
    ``up_scale_ratio`` scales the up weights so that its global scale differs from the gate's
    by that factor. ``progress(done, total)`` is called after each expert.
    """
    w13 = torch.empty(num_experts, 2 * inter, hidden // 2, dtype=torch.uint8, device=device)
    w13_scale = torch.empty(num_experts, 2 * inter, hidden // 16, dtype=torch.float8_e4m3fn,
                            device=device)
    w13_global = torch.empty(num_experts, 2, dtype=torch.float32, device=device)
    w2 = torch.empty(num_experts, hidden, inter // 2, dtype=torch.uint8, device=device)
    w2_scale = torch.empty(num_experts, hidden, inter // 16, dtype=torch.float8_e4m3fn,
                           device=device)
    w2_global = torch.empty(num_experts, dtype=torch.float32, device=device)
    for e in range(num_experts):
        for half, std in ((0, WEIGHT_STD), (1, WEIGHT_STD * up_scale_ratio)):
            p, s, g = random_nvfp4(inter, hidden, device=device, std=std)
            w13[e, half * inter:(half + 1) * inter] = p
            w13_scale[e, half * inter:(half + 1) * inter] = s
            w13_global[e, half] = g
        w2[e], w2_scale[e], w2_global[e] = random_nvfp4(hidden, inter, device=device)
        if progress is not None:
            progress(e + 1, num_experts)
    return QuantizedExperts(w13, w13_scale, w13_global, w2, w2_scale, w2_global)


def random_routing(num_tokens: int, num_experts: int, top_k: int, *,
                   device: str | torch.device = "cpu", expert_start: int = 0,
                   dtype: torch.dtype = torch.int32) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random top-k routing without repeats per token: ``(ids [T, k], weights [T, k])``.

    Ids are in ``[expert_start, expert_start + num_experts)``; weights are softmax-like
    positive fp32 values summing to 1 per token.
    """
    scores = torch.rand(num_tokens, num_experts, device=device)
    ids = scores.topk(top_k, dim=1).indices + expert_start
    weights = torch.rand(num_tokens, top_k, device=device) + 0.1
    weights = weights / weights.sum(dim=1, keepdim=True)
    return ids.to(dtype), weights.float()


def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||a - e|| / ||e||`` computed in fp64 (``||a||`` when ``e`` is all zero)."""
    a = actual.double()
    e = expected.double()
    denom = e.norm().item()
    return (a - e).norm().item() / denom if denom else a.norm().item()


def moe_bf16_dequantized(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: QuantizedExperts,
    *,
    expert_start: int = 0,
    swiglu_limit: float | None = None,
    output_scale: float = 1.0,
) -> torch.Tensor:
    """An independent baseline for ``nvfp4::moe``: dequantize each touched expert to bf16
    (``bf16(e2m1 * scale * global)``) and run the MoE with plain bf16 matmuls.

    It shares no code with :mod:`nvfp4_ops.reference` beyond :func:`format.dequantize`, and
    rounds where a bf16 model would (weights, gate/up, activation), so it differs from the
    exact op by bf16 rounding noise (relative L2 about 3e-3).
    """
    num_tokens, top_k = topk_ids.shape
    inter = experts.w13.shape[1] // 2
    out = torch.zeros(num_tokens, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    ids = topk_ids.long() - expert_start
    for e in range(experts.num_experts):
        hit = ids == e
        if not bool(hit.any()):
            continue
        rows = hit.any(dim=1).nonzero().flatten()
        weight = (topk_weights * hit).sum(dim=1)[rows]
        g = experts.w13_global[e]
        w_gate = fmt.dequantize(experts.w13[e, :inter], experts.w13_scale[e, :inter], g[0])
        w_up = fmt.dequantize(experts.w13[e, inter:], experts.w13_scale[e, inter:], g[1])
        w_down = fmt.dequantize(experts.w2[e], experts.w2_scale[e], experts.w2_global[e])
        x = hidden[rows]
        gate = (x @ w_gate.to(torch.bfloat16).T).float()
        up = (x @ w_up.to(torch.bfloat16).T).float()
        if swiglu_limit is not None:
            gate = gate.clamp(max=swiglu_limit)
            up = up.clamp(-swiglu_limit, swiglu_limit)
        act = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
        y = (act @ w_down.to(torch.bfloat16).T).float()
        out[rows] += weight.unsqueeze(1) * y
    return (out * output_scale).to(torch.bfloat16)


def kernel_ptx(cfg, out_dir: str | Path) -> str:
    """Compile a GEMM kernel config of any family for sm_90a (no GPU needed), keeping its PTX
    in the new folder ``out_dir``; returns the PTX text (for tests that count instructions,
    and for proving that a change leaves the generated code alone)."""
    from nvfp4_ops.kernels import linear_cuda

    out = Path(out_dir)
    out.mkdir(parents=True)
    linear_cuda.compile_function(cfg)(cfg, extra_options=f" --keep-ptx --dump-dir {out}")
    (ptx,) = list(out.glob("*.ptx"))
    return ptx.read_text()


def find_cuda_tool(name: str) -> str:
    """The path of a CUDA binary tool such as ``ptxas`` or ``nvdisasm``, for tests and dev
    scripts that read a kernel's registers or SASS without a GPU.

    Looked up, in order: the CUDA 13 ``nvidia-cuda-nvcc`` wheel's ``nvidia/cu13/bin`` (the
    ``vllm`` extra brings it; its ``ptxas`` reads the PTX 9.x that cutlass-dsl 4.8 emits), then
    triton's bundled ``backends/nvidia/bin`` (its ``nvdisasm`` is fine; its ``ptxas`` 12.9
    rejects PTX 9.x), then ``PATH``.

    Raises:
        FileNotFoundError: ``name`` is in none of these places.
    """
    import importlib.util
    import shutil

    dirs: list[Path] = []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        dirs += [Path(p) / "cu13" / "bin" for p in spec.submodule_search_locations]
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin:
        dirs.append(Path(spec.origin).parent / "backends" / "nvidia" / "bin")
    for folder in dirs:
        if (folder / name).is_file():
            return str(folder / name)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"CUDA tool {name!r} not found in {[str(d) for d in dirs]} or on PATH "
            "(install the vllm extra: pip install -e '.[vllm]')")
    return found


def planned_gemm(a: torch.Tensor, tile_expert: torch.Tensor | None, w: torch.Tensor,
                 w_scale: torch.Tensor, w_global: torch.Tensor, out: torch.Tensor, *,
                 epilogue: str = "none", block_m: int = 16, swiglu_limit: float | None = None,
                 row_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 tile_rows: torch.Tensor | None = None, permuted: bool = False,
                 chained: bool = False, order=None):
    """Plan one W4A16 GEMM the way the ops do (:func:`nvfp4_ops.kernels.dispatch.plan_gemm`
    with the launch's token-tile count) and run it (:func:`nvfp4_ops.kernels.linear_cuda.
    run_gemm`); returns the plan. For GPU tests and tools that drive single GEMMs: ``a`` must
    already be in the plan's ``act_order`` (``permuted``: the tile family's order)."""
    from nvfp4_ops.kernels import dispatch, linear_cuda

    n, k = w.shape[-2], a.shape[1]
    m_tiles = -(-a.shape[0] // block_m)
    m_tiles = (min(m_tiles, dispatch.PERSIST_MAX_TILES + 1) if tile_expert is not None
               else min(m_tiles, dispatch.DENSE_MAX_M_TILES))
    plan = dispatch.plan_gemm(n, k, block_m, epilogue=epilogue, has_bias=bias is not None,
                              grouped=tile_expert is not None, m_tiles=m_tiles,
                              permuted=permuted, chained=chained,
                              order=order or dispatch.WeightOrder.CHECKPOINT)
    linear_cuda.run_gemm(plan, a, w, w_scale, w_global, out, tile_expert=tile_expert,
                         tile_rows=tile_rows, row_scale=row_scale, bias=bias,
                         swiglu_limit=swiglu_limit)
    return plan
