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
from nvfp4_ops.modules import MoEBlock, QuantizedExperts
from nvfp4_ops.shapes import MoEShape

__all__ = [
    "MOE_REL_L2",
    "QuantizedExperts",
    "assert_moe_close",
    "capture_graph",
    "find_cuda_tool",
    "kernel_ptx",
    "moe_bf16_dequantized",
    "planned_gemm",
    "random_experts",
    "random_moe_block",
    "random_nvfp4",
    "random_routing",
    "rel_l2",
    "with_config_fields",
]

WEIGHT_STD = 0.02


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


def random_moe_block(shape: MoEShape, *, device: str | torch.device = "cpu",
                     num_experts: int | None = None,
                     progress: Callable[[int, int], None] | None = None) -> MoEBlock:
    """A :class:`~nvfp4_ops.modules.MoEBlock` with fresh random NVFP4 weights for ``shape``
    (``num_experts`` overrides the shape's; ``progress(done, total)`` after each expert)."""
    e = shape.experts if num_experts is None else num_experts
    experts = random_experts(e, shape.hidden, shape.intermediate, device=device,
                             progress=progress)
    gate_up = [random_nvfp4(shape.shared_intermediate, shape.hidden, device=device)
               for _ in range(2)]
    down = random_nvfp4(shape.hidden, shape.shared_intermediate, device=device)
    shared = (
        torch.cat([gate_up[0][0], gate_up[1][0]]),
        torch.cat([gate_up[0][1], gate_up[1][1]]),
        torch.stack([gate_up[0][2], gate_up[1][2]]),
        *down,
    )
    router = (torch.randn(e, shape.hidden, device=device) * 0.05).to(torch.bfloat16)
    return MoEBlock(shape, experts, shared, router)


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


#: ``nvfp4::moe`` on CUDA vs its reference: the kernels round each slot's weighted expert
#: output to bf16 before the fp32 combine (the reference keeps it fp32): ~2.5e-3 relative L2;
#: fp32 summation order adds ~1e-6.
MOE_REL_L2 = 4e-3


def assert_moe_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """The GPU MoE tests' comparison: ``got`` bf16 of ``want``'s shape, no NaN, relative L2
    below :data:`MOE_REL_L2`, and every element within 2 % of ``want``'s largest magnitude."""
    assert got.shape == want.shape and got.dtype == torch.bfloat16, what
    assert not got.isnan().any(), f"{what}: NaN in output"
    err = rel_l2(got, want)
    assert err < MOE_REL_L2, f"{what}: relative L2 {err:.2e}"
    tol = 0.02 * want.float().abs().max().item() + 1e-3
    max_err = (got.float() - want.float()).abs().max().item()
    assert max_err < tol, f"{what}: max abs error {max_err:.3e} (tolerance {tol:.3e})"


def capture_graph(call: Callable[[], torch.Tensor],
                  warm_calls: int = 1) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """The GPU tests' capture: run ``call`` ``warm_calls`` times on a side stream (compiles or
    loads its kernels, nothing compiles during capture), then capture one call.

    Returns:
        ``(graph, static_out)``: replaying ``graph`` rewrites ``static_out`` from whatever
        the captured call's input tensors hold then.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warm_calls):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = call()
    return graph, static_out


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


def with_config_fields(plan, fields: dict, where: dict | None = None):
    """A MoE plan (:func:`nvfp4_ops.kernels.dispatch.plan_moe`) with ``fields`` set on the
    config of each of its GEMMs, the hot tile's included, whose config has every field and
    every ``where`` value (all those with the fields, without ``where``); the other GEMMs as
    planned. Values take the type of the field they replace (``1`` sets a bool field to
    True). For GPU tests and tools that run a plan with config options other than the
    dispatch's (both forms of the WGMMA ``unroll``, other ring depths, row warpgroups or
    consumer warps)."""
    import dataclasses

    where = where or {}

    def gemm(g):
        if any(not hasattr(g.config, k) for k in fields) or any(
                getattr(g.config, k, object()) != v for k, v in where.items()):
            return g
        typed = {k: type(getattr(g.config, k))(v) for k, v in fields.items()}
        return dataclasses.replace(g, config=dataclasses.replace(g.config, **typed))

    hot = plan.hot
    if hot is not None:
        hot = dataclasses.replace(hot, gate_up=gemm(hot.gate_up), down=gemm(hot.down))
    return dataclasses.replace(plan, gate_up=gemm(plan.gate_up), down=gemm(plan.down), hot=hot)


# --- Benchmark and multi-GPU helpers -------------------------------------------------------
# Fast random experts (random bytes, no quantization), reproducible per expert id so that a
# rank holding experts [a, b) gets exactly the bytes a single GPU holding all of them has;
# routing generators (uniform, Zipf-skewed); expert-parallel slices; the MoE's byte / FLOP
# floor; and the routing layouts the peer MoE kernels read (``benchmarks/bench_moe.py``).

__all__ += [
    "MXFP4_BYTES_PER_WEIGHT",
    "NVFP4_BYTES_PER_WEIGHT",
    "MXFP4Experts",
    "MoECost",
    "align_block_routing",
    "contiguous_routing",
    "ep_slice",
    "expert_popularity",
    "fast_random_experts",
    "fast_random_mxfp4_experts",
    "humming_tuning_subset",
    "moe_cost",
    "make_routing",
    "routing_mismatch",
    "skewed_routing",
    "spread_mxfp4",
    "uniform_routing",
]

#: Bytes per weight of NVFP4 (a 4-bit code + one e4m3 scale per 16) and of MXFP4 (a 4-bit
#: code + one UE8M0 scale per 32); per-tensor or per-row global scales are negligible.
NVFP4_BYTES_PER_WEIGHT = 0.5 + 1 / 16
MXFP4_BYTES_PER_WEIGHT = 0.5 + 1 / 32

# Per-expert generator seeds: seed * _SEED_STRIDE + global expert id.
_SEED_STRIDE = 1_000_003


@dataclass
class MXFP4Experts:
    """Routed-expert tensors in the MXFP4 layout of DeepSeek's own checkpoints (vLLM's
    ``Mxfp4MoEMethod`` parameters): the same packed e2m1 codes as NVFP4 (low nibble = even k)
    and one UE8M0 scale byte (``2**(byte - 127)``; 0xFF is NaN) per 32 consecutive k, no
    global scale."""

    w13: torch.Tensor  # uint8 [E, 2I, H/2]
    w13_scale: torch.Tensor  # uint8 [E, 2I, H/32]
    w2: torch.Tensor  # uint8 [E, H, I/2]
    w2_scale: torch.Tensor  # uint8 [E, H, I/32]

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]


def _expert_generator(device: torch.device | str, seed: int, expert: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * _SEED_STRIDE + expert)


def _random_codes(num_experts: int, hidden: int, inter: int, device, seed: int,
                  first_expert: int) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Random code bytes (every byte is two valid e2m1 codes) for experts
    ``[first_expert, first_expert + num_experts)``; returns the per-expert generators, which
    the callers go on drawing scales from."""
    w13 = torch.empty(num_experts, 2 * inter, hidden // 2, dtype=torch.uint8, device=device)
    w2 = torch.empty(num_experts, hidden, inter // 2, dtype=torch.uint8, device=device)
    gens = []
    for i in range(num_experts):
        gen = _expert_generator(device, seed, first_expert + i)
        w13[i].random_(0, 256, generator=gen)
        w2[i].random_(0, 256, generator=gen)
        gens.append(gen)
    return w13, w2, gens


def fast_random_experts(num_experts: int, hidden: int, inter: int, *,
                        device: str | torch.device = "cpu", seed: int = 0, first_expert: int = 0,
                        shared_gate_up_global: bool = False) -> QuantizedExperts:
    """Random NVFP4 experts without quantizing (for benchmarks and big-shape tests).

    Codes are random bytes, block scales e4m3 of values drawn from [0.25, 1.5], global scales
    ``(0.5 + u) / (4 sqrt(K))`` with ``u`` uniform in [0, 1): outputs of unit-variance inputs
    stay O(1). Expert ``e`` (a global id: ``first_expert + i``) is drawn from its own
    generator seeded by ``(seed, e)``, so any range of experts matches the same experts of
    the full set, bit for bit, on any device of the same kind.

    Args:
        num_experts, hidden, inter: ``E``, ``H``, ``I`` (``H`` and ``I`` multiples of 32).
        seed: the run's seed.
        first_expert: global id of the first expert generated.
        shared_gate_up_global: give gate and up the same global scale, as ModelOpt's NVFP4
            exports of fused gate/up experts do (vLLM keeps one per expert).

    Returns:
        :class:`QuantizedExperts` on ``device`` (``w13_global [E, 2]``, ``w2_global [E]``).

    Raises:
        ValueError: ``hidden`` or ``inter`` not a multiple of 32, or ``num_experts < 1``.
    """
    if hidden % 32 or inter % 32 or num_experts < 1:
        raise ValueError(f"fast_random_experts: need E >= 1 and H, I multiples of 32, got "
                         f"E={num_experts}, H={hidden}, I={inter}")
    w13, w2, gens = _random_codes(num_experts, hidden, inter, device, seed, first_expert)
    w13_scale = torch.empty(num_experts, 2 * inter, hidden // 16, dtype=torch.float8_e4m3fn,
                            device=device)
    w2_scale = torch.empty(num_experts, hidden, inter // 16, dtype=torch.float8_e4m3fn,
                           device=device)
    w13_global = torch.empty(num_experts, 2, dtype=torch.float32, device=device)
    w2_global = torch.empty(num_experts, dtype=torch.float32, device=device)
    for i, gen in enumerate(gens):
        for out in (w13_scale[i], w2_scale[i]):
            out.copy_(torch.rand(out.shape, device=device, generator=gen) * 1.25 + 0.25)
        g = torch.rand(3, device=device, generator=gen) + 0.5
        w13_global[i, 0] = g[0] / (4 * hidden ** 0.5)
        w13_global[i, 1] = (g[0] if shared_gate_up_global else g[1]) / (4 * hidden ** 0.5)
        w2_global[i] = g[2] / (4 * inter ** 0.5)
    return QuantizedExperts(w13, w13_scale, w13_global, w2, w2_scale, w2_global)


def fast_random_mxfp4_experts(num_experts: int, hidden: int, inter: int, *,
                              device: str | torch.device = "cpu", seed: int = 0,
                              first_expert: int = 0,
                              scale_bytes: tuple[int, int] = (117, 122)) -> MXFP4Experts:
    """Random MXFP4 experts: the same code bytes as :func:`fast_random_experts` with the same
    ``(seed, expert)`` and UE8M0 scale bytes uniform in ``scale_bytes`` (inclusive; the default
    2**-10 .. 2**-5 is the range of a checkpoint with ~0.02-std weights).

    Raises:
        ValueError: ``hidden`` or ``inter`` not a multiple of 32, ``num_experts < 1``, or
            ``scale_bytes`` outside 0..254 (0xFF is UE8M0's NaN) or empty.
    """
    lo, hi = scale_bytes
    if hidden % 32 or inter % 32 or num_experts < 1 or not 0 <= lo <= hi <= 254:
        raise ValueError(f"fast_random_mxfp4_experts: need E >= 1, H, I multiples of 32 and "
                         f"0 <= lo <= hi <= 254, got E={num_experts}, H={hidden}, I={inter}, "
                         f"scale_bytes={scale_bytes}")
    w13, w2, gens = _random_codes(num_experts, hidden, inter, device, seed, first_expert)
    w13_scale = torch.empty(num_experts, 2 * inter, hidden // 32, dtype=torch.uint8,
                            device=device)
    w2_scale = torch.empty(num_experts, hidden, inter // 32, dtype=torch.uint8, device=device)
    for i, gen in enumerate(gens):
        w13_scale[i].random_(lo, hi + 1, generator=gen)
        w2_scale[i].random_(lo, hi + 1, generator=gen)
    return MXFP4Experts(w13, w13_scale, w2, w2_scale)


def spread_mxfp4(shape: tuple[int, ...], gen: torch.Generator, row_lo: int = -100,
                 row_hi: int = 100, span: int = 18) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 ``(packed uint8 [..., K/2], scale uint8 [..., K/32])`` on the CPU for
    ``shape = (..., K)``: per-row top exponents in ``[row_lo, row_hi)``, each row's blocks
    spread over ``span`` binades below its top, both ends taken by blocks that hold non-zero
    codes (so the span is real). The scale conversions' edge cases live in such rows."""
    *lead, k = shape
    nb = k // 32
    packed = torch.randint(0, 256, (*lead, k // 2), dtype=torch.uint8, generator=gen)
    top = torch.randint(row_lo, row_hi, (*lead, 1), generator=gen)
    offs = torch.randint(0, span, (*lead, nb), generator=gen)
    offs[..., 0] = 0
    offs[..., -1] = span - 1
    packed[..., :16] |= 0x11
    packed[..., -16:] |= 0x11
    scale = (top - offs + 127).clamp(0, 254).to(torch.uint8)
    return packed, scale


def _routing_weights(num_tokens: int, top_k: int, gen: torch.Generator) -> torch.Tensor:
    weights = torch.rand(num_tokens, top_k, generator=gen) + 0.1
    return weights / weights.sum(dim=1, keepdim=True)


def uniform_routing(num_tokens: int, num_experts: int, top_k: int, *, seed: int = 0,
                    dtype: torch.dtype = torch.int32) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random top-k routing without repeats per token, reproducible from ``seed``
    (drawn on the CPU, so every device gets the same ids): ``(ids [T, k], weights fp32
    [T, k])``, weights positive and summing to 1 per token.

    Raises:
        ValueError: ``top_k`` outside ``[1, num_experts]``.
    """
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"uniform_routing: top_k must be in [1, {num_experts}], got {top_k}")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.rand(num_tokens, num_experts, generator=gen).topk(top_k, dim=1).indices
    return ids.to(dtype), _routing_weights(num_tokens, top_k, gen)


def expert_popularity(num_experts: int, skew: float, *, seed: int = 0) -> torch.Tensor:
    """Zipf expert popularity: ``p[perm[r]] = (r + 1) ** -skew / Z`` over a random permutation
    ``perm`` of the experts (from ``seed``), fp64 ``[E]`` summing to 1; ``skew = 0`` is
    uniform. ``perm`` is ``p.argsort(descending=True)`` (the most popular expert first).

    Raises:
        ValueError: ``skew < 0`` or ``num_experts < 1``.
    """
    if skew < 0 or num_experts < 1:
        raise ValueError(f"expert_popularity: need skew >= 0 and E >= 1, got skew={skew}, "
                         f"E={num_experts}")
    perm = torch.randperm(num_experts, generator=torch.Generator().manual_seed(seed))
    probs = torch.empty(num_experts, dtype=torch.float64)
    probs[perm] = torch.arange(1, num_experts + 1, dtype=torch.float64) ** -skew
    return probs / probs.sum()


def skewed_routing(num_tokens: int, num_experts: int, top_k: int, *, skew: float = 1.2,
                   seed: int = 0,
                   dtype: torch.dtype = torch.int32) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing under Zipf expert popularity (:func:`expert_popularity` with the same
    ``seed``): each token draws ``top_k`` distinct experts, one after another, each with
    probability proportional to its popularity among the experts not yet drawn (sampling
    without replacement). Drawn on the CPU from ``seed``: ``(ids [T, k], weights fp32 [T, k])``.

    Raises:
        ValueError: ``top_k`` outside ``[1, num_experts]``, ``skew < 0``.
    """
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"skewed_routing: top_k must be in [1, {num_experts}], got {top_k}")
    probs = expert_popularity(num_experts, skew, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    if num_tokens == 0:
        ids = torch.empty(0, top_k, dtype=torch.int64)
    else:
        ids = torch.multinomial(probs.expand(num_tokens, num_experts), top_k,
                                replacement=False, generator=gen)
    return ids.to(dtype), _routing_weights(num_tokens, top_k, gen)


def make_routing(kind: str, num_tokens: int, num_experts: int, top_k: int, *,
                 skew: float = 1.2, seed: int = 0,
                 dtype: torch.dtype = torch.int32) -> tuple[torch.Tensor, torch.Tensor]:
    """``kind`` ``"uniform"`` (:func:`uniform_routing`) or ``"skew"`` (:func:`skewed_routing`).

    Raises:
        ValueError: unknown ``kind`` (or what the generator raises).
    """
    if kind == "uniform":
        return uniform_routing(num_tokens, num_experts, top_k, seed=seed, dtype=dtype)
    if kind == "skew":
        return skewed_routing(num_tokens, num_experts, top_k, skew=skew, seed=seed, dtype=dtype)
    raise ValueError(f"make_routing: kind must be 'uniform' or 'skew', got {kind!r}")


def cell_routing(kind: str, num_tokens: int, num_experts: int, top_k: int, *,
                 skew: float = 1.2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The benchmarks' routing of one cell: :func:`make_routing` (CPU, int32 ids) with the
    seed ``seed * 100_003 + 2 T + (kind == "skew")``, so a cell routes alike in every EP
    degree, format, tool and run with this ``seed``, and cells of other T or routing differ.

    Raises:
        ValueError: as :func:`make_routing`.
    """
    return make_routing(kind, num_tokens, num_experts, top_k, skew=skew,
                        seed=seed * 100_003 + num_tokens * 2 + (kind == "skew"))


def ep_slice(num_experts: int, ep: int, rank: int | None = None) -> tuple[int, int]:
    """``(expert_start, local_experts)`` of rank ``rank`` (default ``ep // 2``, a rank in the
    middle) when ``num_experts`` experts are split into ``ep`` contiguous equal ranges.

    Raises:
        ValueError: ``ep < 1``, ``num_experts % ep != 0`` or ``rank`` outside ``[0, ep)``.
    """
    if ep < 1 or num_experts % ep:
        raise ValueError(f"ep_slice: {num_experts} experts do not split into ep={ep} equal "
                         "ranges")
    rank = ep // 2 if rank is None else rank
    if not 0 <= rank < ep:
        raise ValueError(f"ep_slice: rank must be in [0, {ep}), got {rank}")
    local = num_experts // ep
    return rank * local, local


@dataclass(frozen=True)
class MoECost:
    """What one MoE call on one rank must move and compute (:func:`moe_cost`)."""

    local_rows: int  # routed slots (token, expert) whose expert is local
    touched_experts: int  # distinct local experts with at least one slot
    bytes: float  # weight bytes of the touched experts
    flops: float  # 6 * local_rows * H * I (gate/up 4 H I, down 2 H I per row)
    roofline_us: float  # max(bytes / HBM bandwidth, flops / peak)


def moe_cost(topk_ids: torch.Tensor, hidden: int, inter: int, *, expert_start: int = 0,
             local_experts: int | None = None,
             bytes_per_weight: float = NVFP4_BYTES_PER_WEIGHT, hbm_tbps: float = 4.1,
             peak_tflops: float = 790.0) -> MoECost:
    """The floor of one MoE call: each touched local expert's ``3 H I`` weights read once
    (``bytes_per_weight`` each) at ``hbm_tbps``, or ``6 H I`` FLOPs per local row at
    ``peak_tflops``, whichever takes longer. ``local_experts=None``: every id is local.

    Raises:
        ValueError: ``local_experts < 1``.
    """
    ids = topk_ids.reshape(-1).long()
    if local_experts is None:
        local = torch.ones_like(ids, dtype=torch.bool)
    elif local_experts < 1:
        raise ValueError(f"moe_cost: local_experts must be >= 1, got {local_experts}")
    else:
        local = (ids >= expert_start) & (ids < expert_start + local_experts)
    rows = int(local.sum())
    touched = int(torch.unique(ids[local]).numel())
    nbytes = touched * 3 * hidden * inter * bytes_per_weight
    flops = 6.0 * rows * hidden * inter
    roof = max(nbytes / (hbm_tbps * 1e12), flops / (peak_tflops * 1e12)) * 1e6
    return MoECost(rows, touched, nbytes, flops, roof)


def _local_keys(topk_ids: torch.Tensor, expert_start: int,
                local_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per slot (flattened ``[T*k]``): the local expert index, or ``local_experts`` for slots
    of other ranks' experts; and the stable order that sorts slots by that key."""
    flat = topk_ids.reshape(-1).long() - expert_start
    key = torch.where((flat >= 0) & (flat < local_experts), flat, local_experts)
    return key, torch.argsort(key, stable=True)


def align_block_routing(topk_ids: torch.Tensor, block_size: int, *, num_experts: int,
                        expert_start: int = 0, local_experts: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The block-aligned routing of vLLM's ``moe_align_block_size`` (with
    ``ignore_invalid_experts``), which "indexed" MoE GEMMs read: slots grouped by local
    expert, each group padded to a multiple of ``block_size``. Computed with plain torch (not
    for the timed path).

    Args:
        topk_ids: ``int [T, k]`` global expert ids.
        block_size: rows per GEMM tile.
        num_experts: global expert count (sizes the buffers as vLLM does).
        expert_start, local_experts: this rank's range (default: all experts).

    Returns:
        ``sorted_ids int32 [P_max]``: slot ids (``t * k + j``) expert by expert, padding
        entries ``T * k``; ``expert_ids int32 [ceil(P_max / block_size)]``: the local expert of
        each block, -1 past the last used block; ``num_tokens_padded int32 [1]``: the used
        length of ``sorted_ids``. ``P_max = T k + E (block_size - 1)``, or ``T k block_size``
        when smaller (vLLM's bound).

    Raises:
        ValueError: ``block_size < 1``.
    """
    if block_size < 1:
        raise ValueError(f"align_block_routing: block_size must be >= 1, got {block_size}")
    local_experts = num_experts if local_experts is None else local_experts
    device = topk_ids.device
    numel = topk_ids.numel()
    max_padded = numel + num_experts * (block_size - 1)
    if numel < num_experts:
        max_padded = min(numel * block_size, max_padded)
    key, order = _local_keys(topk_ids, expert_start, local_experts)
    counts = torch.bincount(key, minlength=local_experts + 1)[:local_experts]
    padded = (counts + block_size - 1) // block_size * block_size
    starts = torch.cumsum(padded, 0) - padded
    count_starts = torch.cumsum(counts, 0) - counts
    num_valid = int(counts.sum())
    sorted_ids = torch.full((max_padded,), numel, dtype=torch.int32, device=device)
    slots = order[:num_valid]
    expert = key[slots]
    rank_in_expert = torch.arange(num_valid, device=device) - count_starts[expert]
    sorted_ids[starts[expert] + rank_in_expert] = slots.to(torch.int32)
    expert_ids = torch.full((-(-max_padded // block_size),), -1, dtype=torch.int32,
                            device=device)
    block_expert = torch.repeat_interleave(torch.arange(local_experts, device=device),
                                           padded // block_size)
    expert_ids[:block_expert.numel()] = block_expert.to(torch.int32)
    num_padded = padded.sum().to(torch.int32).reshape(1)
    return sorted_ids, expert_ids, num_padded


def contiguous_routing(topk_ids: torch.Tensor, *, expert_start: int = 0,
                       local_experts: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The expert-contiguous layout of vLLM's ``moe_prepare_scatter``, which "grouped
    contiguous" MoE GEMMs read: local slots sorted by expert (stable). Plain torch.

    Args:
        topk_ids: ``int [T, k]`` global expert ids.
        expert_start, local_experts: this rank's range (default: every id present is local,
            ``local_experts = max id + 1``).

    Returns:
        ``expert_offsets int64 [E_local + 1]`` (rows ``[offsets[e], offsets[e+1])`` belong to
        local expert ``e``), and ``inverse int32 [T, k]``: the row of each slot, -1 for other
        ranks' experts.
    """
    if local_experts is None:
        local_experts = int(topk_ids.max()) + 1 - expert_start if topk_ids.numel() else 1
    key, order = _local_keys(topk_ids, expert_start, local_experts)
    counts = torch.bincount(key, minlength=local_experts + 1)[:local_experts]
    offsets = torch.zeros(local_experts + 1, dtype=torch.int64, device=topk_ids.device)
    offsets[1:] = torch.cumsum(counts, 0)
    num_valid = int(counts.sum())
    inverse = torch.full((topk_ids.numel(),), -1, dtype=torch.int32, device=topk_ids.device)
    inverse[order[:num_valid]] = torch.arange(num_valid, dtype=torch.int32,
                                              device=topk_ids.device)
    return offsets, inverse.reshape(topk_ids.shape)



def routing_mismatch(got, want, topk_ids: torch.Tensor, expert_start: int) -> str | None:
    """What differs between two :class:`~nvfp4_ops.kernels.triton.moe_routing.MoERouting` of
    the same ``topk_ids`` (``None``: the same routing), up to the order of the slots inside an
    expert's segment (atomics place them): offsets, tile lists and padding rows equal, the same
    slots local, each local slot's row inside its own expert's segment, and ``sorted_slots``
    the inverse of ``slot_row``. Base tiles only (no hot class)."""
    for name in ("expert_offsets", "tile_expert", "tile_rows"):
        if not torch.equal(getattr(got, name), getattr(want, name)):
            return name
    num_slots = got.slot_row.numel()
    if not torch.equal(got.sorted_slots == num_slots, want.sorted_slots == num_slots):
        return "padding rows (sorted_slots sentinel)"
    num_local = got.expert_offsets.numel() - 1
    local = topk_ids.reshape(-1).to(got.slot_row.device).long() - expert_start
    is_local = (local >= 0) & (local < num_local)
    if not torch.equal(got.slot_row >= 0, is_local):
        return "which slots are local (slot_row)"
    slots = is_local.nonzero().flatten()
    rows = got.slot_row[slots].long()
    if not torch.equal(got.sorted_slots[rows].long(), slots):
        return "sorted_slots is not the inverse of slot_row"
    offsets = got.expert_offsets.long()
    experts = local[slots]
    if not bool(((offsets[experts] <= rows) & (rows < offsets[experts + 1])).all()):
        return "a slot outside its expert's segment"
    return None

# ---------------------------------------------------------------- multi-GPU runs

#: The environment every process of a multi-GPU run keeps: NVLink multicast off (it can take
#: the host's GPUs out of service), so nothing calls ``cuMulticastCreate``.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}


def humming_tuning_subset(entries: list, row_counts) -> list:
    """The entries of a Humming tuning list (``[lo, hi, config]``, matched ``lo < m <= hi``)
    that a call with any of ``row_counts`` as its ``valid_shape_m`` can select, plus the entry
    for ``m = 1``, which Humming's launcher looks up first (its base kernel's metadata) and
    refuses to miss ("shape_m is not within any range defined in configs"). Entries whose
    bounds equal a count are kept on both sides of the boundary. Humming compiles every entry
    of the list it is given, so a benchmark hands it only these."""
    return [entry for entry in entries
            if entry[0] < 1 <= entry[1] or any(entry[0] <= m <= entry[1] for m in row_counts)]


def init_nccl_rank(rank: int, world: int, rendezvous_file: str) -> torch.device:
    """Start one rank of a multi-GPU run: :data:`MULTICAST_OFF` in this process, GPU
    ``rank`` current, an NCCL process group of ``world`` ranks met through
    ``rendezvous_file`` (5-minute timeout). Returns the rank's device; the caller destroys
    the group (``torch.distributed.destroy_process_group``)."""
    import datetime
    import os

    import torch.distributed as dist

    os.environ.update(MULTICAST_OFF)
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"file://{rendezvous_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(minutes=5),
                            device_id=device)
    return device


__all__ += ["MULTICAST_OFF", "init_nccl_rank"]
