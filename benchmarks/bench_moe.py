"""Benchmark ``nvfp4::moe`` (whole op: routing prep through combine) on one GPU.

Side by side in the same run, for each shape and token count ``T``:

* **ours**: ``nvfp4_ops.moe`` with NVFP4 weights, their codes in the bit order the vLLM glue
  uses (``--weight-order auto``: ``wperm`` where ``moe_cuda.wperm_supported``, prepared once
  with ``nvfp4_ops.to_wperm_``; ``checkpoint`` / ``wperm`` force one);
* **bf16**: the same MoE with bf16 weights and ``torch._grouped_mm`` (routing by ``argsort``,
  gather, grouped GEMM 1, clamped SwiGLU, grouped GEMM 2, router weight, ``index_add_``
  combine) on the same routing.

Timing: each variant is captured once in a CUDA graph; every measured replay is preceded by an
untimed L2 flush and timed with CUDA events; we report the median. ``--flush write`` (default,
every committed result so far) writes a 256 MB buffer: L2 is then full of dirty lines whose
write-back competes with the timed kernel for HBM, which likely inflates short calls.
``--flush read`` reads the buffer instead (clean lines, nothing to write back).
Routing is uniform random top-k (distinct experts per token).

Reported per row:

* ``us``: median device time of one whole MoE call.
* ``TB/s``: effective weight bandwidth = ``D * B_e / t`` with ``D`` the experts this routing
  touches and ``B_e = 3 H I * 0.5625`` bytes (NVFP4 codes + e4m3 block scales of one expert);
  the same byte count is used for the bf16 baseline (so it is comparable, not its real
  traffic).
* ``TFLOP/s``: ``6 T k H I / t``.
* ``%roof``: ``t_roof / t`` with ``t_roof = max(D B_e / 4.1 TB/s, 6 T k H I / 790 TFLOP/s)``
  (REFERENCE.md section 5: H200 copy bandwidth and bf16 dense peak).
* ``speedup``: ``t_bf16 / t_ours``.

Run: ``python benchmarks/bench_moe.py --shapes v4-flash v4-pro --check``; JSON lands in
``benchmarks/results/moe_<gpu>_<stamp>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from _timing import capture, replay_median_us

import nvfp4_ops
from nvfp4_ops.shapes import MoEShape, get_shape
from nvfp4_ops.testing import random_routing, rel_l2

RESULTS = Path(__file__).resolve().parent / "results"
HBM_TBPS = 4.1
PEAK_TFLOPS = 790.0
DEFAULT_TOKENS = (1, 8, 32, 128, 512, 4096, 16384)
CHECK_TOKENS = (1, 128, 4096)


@dataclass(frozen=True)
class BenchConfig:
    shape: MoEShape
    num_tokens: int
    reps: int
    warm_reps: int = 3


@dataclass
class Row:
    shape: str
    T: int
    experts_touched: int
    ours_us: float
    bf16_us: float | None
    speedup: float | None
    ours_tbps: float
    ours_tflops: float
    ours_pct_roofline: float
    bf16_tbps: float | None
    roofline_us: float
    block_m: int


def fast_random_experts(shape: MoEShape, device: str) -> tuple[torch.Tensor, ...]:
    """Random NVFP4 expert tensors (valid codes, finite e4m3 scales) without quantizing:
    random bytes for the codes, scales drawn from [0.25, 1.5], globals ~ 1/sqrt(K)/4."""
    e, h, i = shape.experts, shape.hidden, shape.intermediate
    gen = torch.Generator(device=device).manual_seed(1234)

    def scales(*size):
        return (torch.rand(*size, device=device, generator=gen) * 1.25 + 0.25).to(
            torch.float8_e4m3fn)

    w13 = torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8, device=device,
                        generator=gen)
    w13_scale = scales(e, 2 * i, h // 16)
    w13_global = (torch.rand(e, 2, device=device, generator=gen) + 0.5) / (4 * math.sqrt(h))
    w2 = torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8, device=device, generator=gen)
    w2_scale = scales(e, h, i // 16)
    w2_global = (torch.rand(e, device=device, generator=gen) + 0.5) / (4 * math.sqrt(i))
    return w13, w13_scale, w13_global, w2, w2_scale, w2_global


class Bf16GroupedMoE:
    """The bf16 baseline: bf16 weights (random, same sizes), ``torch._grouped_mm``."""

    def __init__(self, shape: MoEShape, device: str) -> None:
        e, h, i = shape.experts, shape.hidden, shape.intermediate
        gen = torch.Generator(device=device).manual_seed(99)
        # [E, N, K] contiguous, passed transposed ([E, K, N], K-major) as _grouped_mm wants.
        # Filled a few experts at a time: an fp32 randn of all V4-Pro experts would be 67 GB.
        self.w13 = torch.empty(e, 2 * i, h, dtype=torch.bfloat16, device=device)
        self.w2 = torch.empty(e, h, i, dtype=torch.bfloat16, device=device)
        for e0 in range(0, e, 16):
            e1 = min(e, e0 + 16)
            self.w13[e0:e1] = torch.randn(e1 - e0, 2 * i, h, device=device,
                                          generator=gen) / math.sqrt(h)
            self.w2[e0:e1] = torch.randn(e1 - e0, h, i, device=device,
                                         generator=gen) / math.sqrt(i)
        self.num_experts = e
        self.inter = i
        self.limit = shape.swiglu_limit

    def __call__(self, hidden, topk_ids, topk_weights):
        num_tokens, top_k = topk_ids.shape
        flat = topk_ids.reshape(-1).long()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(self.num_experts, dtype=torch.int32, device=hidden.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        token = order // top_k
        x = hidden.index_select(0, token)
        gate_up = torch._grouped_mm(x, self.w13.transpose(1, 2), offs=offs)
        gate = gate_up[:, :self.inter].float().clamp(max=self.limit)
        up = gate_up[:, self.inter:].float().clamp(-self.limit, self.limit)
        act = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
        y = torch._grouped_mm(act, self.w2.transpose(1, 2), offs=offs)
        y = y.float() * topk_weights.reshape(-1)[order].unsqueeze(1)
        out = torch.zeros(num_tokens, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        out.index_add_(0, token, y)
        return out.to(torch.bfloat16)


def l2_flush(buf: torch.Tensor, mode: str = "write"):
    """A callable that evicts L2 through ``buf`` (larger than L2): ``write`` fills it (dirty
    lines), ``read`` reduces over it (clean lines)."""
    if mode == "write":
        return lambda: buf.fill_(1)
    if mode == "read":
        return lambda: torch.amax(buf)
    raise ValueError(f"flush mode must be write or read, got {mode!r}")


def time_graph(fn, reps: int, warm_reps: int, flush) -> float:
    """Median µs of ``fn`` replayed from a CUDA graph, L2 flushed before every timed replay
    (``flush``: a callable from :func:`l2_flush`, or a buffer to write)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warm_reps):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = capture([fn])
    t = replay_median_us(graph, reps,
                         before_each=flush if callable(flush) else l2_flush(flush))
    del graph
    return t


def versions() -> dict[str, str]:
    out = {"torch": torch.__version__, "python": sys.version.split()[0]}
    for dist in ("triton", "nvidia-cutlass-dsl", "apache-tvm-ffi"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "unknown"
    if out["triton"] == "unknown":
        import triton

        out["triton"] = triton.__version__
    if out["nvidia-cutlass-dsl"] == "unknown":
        try:
            import cutlass

            out["nvidia-cutlass-dsl"] = getattr(cutlass, "__version__", "unknown")
        except ImportError:
            pass
    out["cuda"] = torch.version.cuda or "none"
    return out


def check(shape: MoEShape, experts, tokens, device: str, wperm: bool = False) -> list[dict]:
    """Ours vs the reference on the benchmark's own weights and routing (``wperm``: the
    weights' codes are in that bit order; both read them so)."""
    from nvfp4_ops.reference import moe_reference

    results = []
    for num_tokens in tokens:
        hidden, ids, weights = moe_inputs(shape, num_tokens, num_tokens, device)
        args = (hidden, ids, weights, *experts)
        got = nvfp4_ops.moe(*args, swiglu_limit=shape.swiglu_limit, output_scale=1.5,
                            wperm=wperm)
        want = moe_reference(*args, 0, shape.swiglu_limit, 1.5, wperm=wperm)
        err = rel_l2(got, want)
        ok = err < 4e-3 and not bool(got.isnan().any())
        results.append({"shape": shape.name, "T": num_tokens, "rel_l2": err, "ok": ok})
        print(f"check {shape.name:9s} T={num_tokens:6d} rel_l2={err:.2e} {'ok' if ok else 'FAIL'}",
              flush=True)
    return results


def bench_shape(shape: MoEShape, tokens, reps: int, do_check: bool, baseline: bool,
                device: str, weight_order: str = "auto",
                flush_mode: str = "write") -> tuple[list[Row], list[dict]]:
    from nvfp4_ops.kernels import moe_cuda

    t0 = time.time()
    experts = fast_random_experts(shape, device)
    # the weight bit order the vLLM glue would use ("auto"), or the one asked for
    wperm = weight_order == "wperm" or (
        weight_order == "auto" and moe_cuda.wperm_supported(shape.hidden, shape.intermediate))
    if wperm:
        nvfp4_ops.to_wperm_(experts[0])
        nvfp4_ops.to_wperm_(experts[3])
    print(f"{shape.name}: weight codes in the {'wperm' if wperm else 'checkpoint'} bit order",
          flush=True)
    base = Bf16GroupedMoE(shape, device) if baseline else None
    torch.cuda.synchronize()
    print(f"{shape.name}: weights ready in {time.time() - t0:.1f} s", flush=True)
    t0 = time.time()
    from nvfp4_ops import _compile

    _compile.warmup([shape.name])  # grouped-GEMM variants: compile (or load) + run once
    moe_cuda.warmup_triton(shape.hidden, shape.top_k, device)
    print(f"{shape.name}: warmup {time.time() - t0:.1f} s", flush=True)
    checks = check(shape, experts, CHECK_TOKENS, device, wperm) if do_check else []
    if do_check and not all(c["ok"] for c in checks):
        raise SystemExit(f"{shape.name}: --check failed: {checks}")
    flush = l2_flush(torch.empty(256 * 2**20, dtype=torch.uint8, device=device), flush_mode)
    bytes_per_expert = shape.bytes_per_expert
    rows = []
    for num_tokens in tokens:
        cfg = BenchConfig(shape, num_tokens, reps)
        hidden, ids, weights = moe_inputs(shape, num_tokens, 7 + num_tokens, device)
        touched = int(torch.unique(ids).numel())
        flops = 6.0 * num_tokens * shape.top_k * shape.hidden * shape.intermediate
        moved = touched * bytes_per_expert
        roof_us = max(moved / (HBM_TBPS * 1e12), flops / (PEAK_TFLOPS * 1e12)) * 1e6

        def ours(hidden=hidden, ids=ids, weights=weights):
            return nvfp4_ops.moe(hidden, ids, weights, *experts,
                                 swiglu_limit=shape.swiglu_limit, output_scale=1.0,
                                 wperm=wperm)

        def bf16(hidden=hidden, ids=ids, weights=weights):
            return base(hidden, ids, weights)

        ours_us = time_graph(ours, cfg.reps, cfg.warm_reps, flush)
        bf16_us = None
        if base is not None:
            bf16_us = time_graph(bf16, cfg.reps, cfg.warm_reps, flush)
        row = Row(
            shape=shape.name, T=num_tokens, experts_touched=touched,
            ours_us=ours_us, bf16_us=bf16_us,
            speedup=bf16_us / ours_us if bf16_us else None,
            ours_tbps=moved / (ours_us * 1e-6) / 1e12,
            ours_tflops=flops / (ours_us * 1e-6) / 1e12,
            ours_pct_roofline=100.0 * roof_us / ours_us,
            bf16_tbps=moved / (bf16_us * 1e-6) / 1e12 if bf16_us else None,
            roofline_us=roof_us,
            block_m=moe_cuda.op_tile(num_tokens, shape.top_k, shape.experts, shape.hidden,
                                     shape.intermediate)[0],
        )
        rows.append(row)
        print(format_row(row), flush=True)
    return rows, checks


def sweep_and_breakdown(shape: MoEShape, tokens, reps: int, device: str) -> list[dict]:
    """Diagnostics: the whole op at every ``block_m`` and the time of each stage at the chosen
    one (routing+gather, GEMM 1, GEMM 2, combine), each from its own graph. The GEMMs take the
    global scales as views (``[E, 2, I]``, ``[E, 1, H]``), as the op passes them."""
    experts = fast_random_experts(shape, device)
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    out = []
    for num_tokens in tokens:
        line = _diagnose(shape, experts, num_tokens, reps, flush, device)
        print(json.dumps(line), flush=True)
        out.append(line)
    return out


def moe_inputs(shape: MoEShape, num_tokens: int, seed: int, device: str = "cuda"):
    """``(hidden bf16 [T, H], topk_ids, topk_weights fp32 [T, k])``: seeded random hidden
    states and uniform random top-k routing (distinct experts per token)."""
    torch.manual_seed(seed)
    hidden = torch.randn(num_tokens, shape.hidden, device=device).to(torch.bfloat16)
    ids, weights = random_routing(num_tokens, shape.experts, shape.top_k, device=device)
    return hidden, ids, weights


@dataclass
class MoEGemm:
    """One of the MoE's grouped GEMMs with the operands the op gives it (:func:`moe_gemms`):
    ``a [P, K]`` -> ``out [P, N_out]`` over the routing's tiles, weights ``w [E, N, K/2]``,
    block scales, the global-scale view the op passes, and the epilogue's extras."""

    name: str  # "gemm1" (gate/up + SwiGLU) or "gemm2" (down + router weight)
    n: int
    k: int
    epilogue: str
    a: torch.Tensor
    out: torch.Tensor
    w: torch.Tensor
    w_scale: torch.Tensor
    w_global: torch.Tensor
    row_scale: torch.Tensor | None
    swiglu_limit: float | None
    routing: object  # moe_routing.MoERouting
    block_m: int

    def run(self, **kw):
        """The op's own dispatch (``grouped_w4a16_gemm``); ``kw``: kperm, pdl, wperm."""
        from nvfp4_ops.kernels import linear_cuda

        return linear_cuda.grouped_w4a16_gemm(
            self.a, self.routing.tile_expert, self.w, self.w_scale, self.w_global, self.out,
            epilogue=self.epilogue, swiglu_limit=self.swiglu_limit, row_scale=self.row_scale,
            bias=None, block_m=self.block_m, tile_rows=self.routing.tile_rows, **kw)

    def launcher(self, cfg, w: torch.Tensor | None = None):
        """A zero-argument callable launching kernel config ``cfg`` on these operands (``w``:
        other weights of the same shape, e.g. in another code order)."""
        from nvfp4_ops.kernels import linear_cuda

        w = self.w if w is None else w
        return lambda: linear_cuda._launch(cfg, self.a, self.routing.tile_expert, w,
                                           self.w_scale, self.w_global, self.out,
                                           self.swiglu_limit, self.row_scale, None,
                                           self.routing.tile_rows)


class MoEGemms(NamedTuple):
    """The op's data flow up to its GEMMs at one tile (:func:`moe_gemms`)."""

    routing: object  # moe_routing.MoERouting at block_m
    gemm1: MoEGemm  # reads the gathered rows, writes act [P, I]
    gemm2: MoEGemm  # reads act, writes the router-weighted expert outputs [P, H]
    real: torch.Tensor  # bool [P]: rows of real (not skipped) tiles, the rows the op reads
    m_tiles: int  # ceil(P / block_m), clamped as the op clamps it


def moe_gemms(shape: MoEShape, experts, hidden, ids, weights, block_m: int,
              kperm: bool) -> MoEGemms:
    """Routing and gather as ``moe_cuda.moe_forward`` runs them (``kperm``: the gather writes
    the permuted order of the family serving ``block_m``), and the two grouped GEMMs with
    their operands, outputs allocated once (outside any graph capture)."""
    from nvfp4_ops.kernels import linear_cuda
    from nvfp4_ops.kernels.triton import moe_routing

    w13, w13_scale, w13_global, w2, w2_scale, w2_global = experts
    inter, hidden_size = shape.intermediate, shape.hidden
    routing = moe_routing.moe_routing(ids, shape.experts, 0, block_m)
    a, row_scale = moe_routing.gather_rows(hidden, weights, routing, kperm)
    p = a.shape[0]
    act = torch.empty(p, inter, dtype=torch.bfloat16, device=hidden.device)
    y = torch.empty(p, hidden_size, dtype=torch.bfloat16, device=hidden.device)
    common = {"routing": routing, "block_m": block_m}
    gemm1 = MoEGemm("gemm1", 2 * inter, hidden_size, "swiglu", a, act, w13, w13_scale,
                    linear_cuda.gate_up_global_view(w13_global, inter), None,
                    shape.swiglu_limit, **common)
    gemm2 = MoEGemm("gemm2", hidden_size, inter, "row_scale", act, y, w2, w2_scale,
                    linear_cuda.per_group_global_view(w2_global, hidden_size), row_scale,
                    None, **common)
    real = torch.repeat_interleave(routing.tile_expert >= 0, block_m)[:p]
    m_tiles = min(p // block_m, linear_cuda._m_tiles_cap(True))
    return MoEGemms(routing, gemm1, gemm2, real, m_tiles)


def moe_stages(shape: MoEShape, experts, hidden, ids, weights, block_m: int,
               kperm: bool) -> dict:
    """Stage name -> zero-argument callable for the op's stages at one tile (routing + gather,
    GEMM 1, GEMM 2, combine), as ``moe_cuda.moe_forward`` runs them (launch overlap off), on
    the operands of :func:`moe_gemms`."""
    from nvfp4_ops.kernels.triton import moe_combine, moe_routing

    kw = {"kperm": True} if kperm else {}
    g = moe_gemms(shape, experts, hidden, ids, weights, block_m, kperm)
    return {
        "routing+gather": lambda: moe_routing.gather_rows(
            hidden, weights, moe_routing.moe_routing(ids, shape.experts, 0, block_m), kperm),
        "gemm1 swiglu": lambda: g.gemm1.run(**kw),
        "gemm2 row_scale": lambda: g.gemm2.run(**kw),
        "combine": lambda: moe_combine.combine(g.gemm2.out, g.routing.slot_row,
                                               hidden.shape[0], shape.top_k, 1.0),
    }


def _diagnose(shape: MoEShape, experts, num_tokens: int, reps: int, flush: torch.Tensor,
              device: str) -> dict:
    from nvfp4_ops.kernels import linear_cuda, moe_cuda

    gemm = linear_cuda.grouped_w4a16_gemm
    hidden, ids, weights = moe_inputs(shape, num_tokens, 7 + num_tokens, device)
    whole = {}
    for bm in moe_cuda.BLOCK_MS:
        def run(bm=bm):
            return moe_cuda.moe_forward(
                hidden, ids, weights, *experts, 0, shape.swiglu_limit, 1.0, gemm=gemm,
                block_m=bm, kperm=linear_cuda.grouped_kperm(shape.hidden, shape.intermediate,
                                                            bm))
        whole[bm] = time_graph(run, reps, 2, flush)
    bm, kp = moe_cuda.op_tile(num_tokens, shape.top_k, shape.experts, shape.hidden,
                              shape.intermediate)
    stages = moe_stages(shape, experts, hidden, ids, weights, bm, kp)
    stage_us = {name: time_graph(fn, reps, 2, flush) for name, fn in stages.items()}
    return {"shape": shape.name, "T": num_tokens, "chosen_block_m": bm,
            "whole_us_by_block_m": whole, "stage_us": stage_us}


HEADER = (f"{'shape':9s} {'T':>6s} {'D':>4s} {'bm':>3s} {'ours us':>9s} {'bf16 us':>9s} "
          f"{'speedup':>7s} {'TB/s':>6s} {'TFLOP/s':>8s} {'%roof':>6s} {'roof us':>8s}")


def format_row(r: Row) -> str:
    bf = f"{r.bf16_us:9.1f}" if r.bf16_us else f"{'-':>9s}"
    sp = f"{r.speedup:6.2f}x" if r.speedup else f"{'-':>7s}"
    return (f"{r.shape:9s} {r.T:6d} {r.experts_touched:4d} {r.block_m:3d} {r.ours_us:9.1f} "
            f"{bf} {sp} {r.ours_tbps:6.2f} {r.ours_tflops:8.1f} {r.ours_pct_roofline:5.1f}% "
            f"{r.roofline_us:8.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["v4-flash"])
    parser.add_argument("--tokens", nargs="+", type=int, default=list(DEFAULT_TOKENS))
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--check", action="store_true", help="verify against the reference first")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    parser.add_argument("--weight-order", choices=["auto", "checkpoint", "wperm"],
                        default="auto", help="the experts' code bit order (auto: wperm where "
                        "the kernels read it, as the vLLM glue does)")
    parser.add_argument("--flush", choices=["write", "read"], default="write",
                        help="how L2 is flushed before each timed replay (module docstring)")
    parser.add_argument("--sweep", action="store_true",
                        help="diagnostics only: whole op per block_m and per-stage times")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_moe: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = "cuda"
    if "moe" not in nvfp4_ops.kernels.CUDA_KERNELS:  # this benchmark measures the CUDA path
        nvfp4_ops.kernels.CUDA_KERNELS["moe"] = "nvfp4_ops.kernels.moe_cuda:moe_cuda"
    print(f"nvfp4::moe runs: {nvfp4_ops.kernels.describe('moe', device)}", flush=True)
    if args.sweep:
        lines = []
        for name in args.shapes:
            lines += sweep_and_breakdown(get_shape(name), args.tokens, args.reps, device)
        if args.out:
            args.out.write_text(json.dumps(lines, indent=1))
        return 0
    print(HEADER, flush=True)
    all_rows, all_checks = [], []
    for name in args.shapes:
        rows, checks = bench_shape(get_shape(name), args.tokens, args.reps, args.check,
                                   not args.no_baseline, device, args.weight_order,
                                   args.flush)
        all_rows += rows
        all_checks += checks
        torch.cuda.empty_cache()  # this shape's weights are gone; give the next one room
    gpu = torch.cuda.get_device_name()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or RESULTS / f"moe_{gpu.replace(' ', '_')}_{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "gpu": gpu, "versions": versions(), "utc": stamp,
        "method": "CUDA-graph replay, L2 flushed before each replay, median of reps",
        "flush": args.flush,
        "reps": args.reps, "implementation": nvfp4_ops.kernels.describe("moe", device),
        "weight_order": args.weight_order,
        "roofline": {"hbm_tbps": HBM_TBPS, "peak_tflops": PEAK_TFLOPS},
        "checks": all_checks, "rows": [dataclasses.asdict(r) for r in all_rows],
    }
    out.write_text(json.dumps(payload, indent=1))
    print(f"\n{HEADER}")
    for r in all_rows:
        print(format_row(r))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
