"""Shared pieces of the dev A/B scripts (``dev_ab_*.py``: diagnostics, need a GPU): the common
command line, the GPU setup and the alternating-rounds timer."""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Hashable
from pathlib import Path

import torch


def parser(doc: str, *, tokens: list[int], reps: int) -> argparse.ArgumentParser:
    """``--tokens`` (default ``tokens``), ``--reps`` (CUDA-graph replays per timing, default
    ``reps``), ``--rounds`` (default 3) and ``--out`` (JSON file); the description is the
    first line of ``doc``."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--tokens", nargs="+", type=int, default=tokens)
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path)
    return p


def gpu_setup(shape_name: str = "v4-flash"):
    """``(bench_moe, shape, experts, flush)``: the benchmark module, the MoE shape, its random
    NVFP4 experts on the GPU (``bench_moe.fast_random_experts``) and a 256 MiB buffer whose fill
    flushes L2; None (after a message) without a CUDA GPU."""
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return None
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_moe

    from nvfp4_ops import get_shape

    shape = get_shape(shape_name)
    experts = bench_moe.fast_random_experts(shape, "cuda")
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    return bench_moe, shape, experts, flush


def alternate(runs: dict[Hashable, Callable[[], object]], rounds: int, reps: int,
              flush: torch.Tensor) -> tuple[dict, dict]:
    """Time every zero-argument callable of ``runs`` as its own CUDA graph (``bench_moe.
    time_graph``: L2 flushed before every replay, median of ``reps``), each once per round for
    ``rounds`` rounds so that clock drift hits them alike. Returns ``(median µs over rounds,
    per-round µs)``, both keyed like ``runs``."""
    import bench_moe

    times: dict = {key: [] for key in runs}
    for _ in range(rounds):
        for key, fn in runs.items():
            times[key].append(bench_moe.time_graph(fn, reps, 2, flush))
    return {key: statistics.median(v) for key, v in times.items()}, times


def alternate_cases(cases: dict[str, dict[str, Callable[[], object]]], rounds: int, reps: int,
                    flush: torch.Tensor) -> dict[str, dict[str, float]]:
    """:func:`alternate` over every variant of every case (``{case: {variant: fn}}``), all
    interleaved in each round; returns ``{case: {variant: median µs}}`` in the same order."""
    flat, _ = alternate({(case, name): fn for case, vs in cases.items()
                         for name, fn in vs.items()}, rounds, reps, flush)
    med: dict[str, dict[str, float]] = {}
    for (case, name), us in flat.items():
        med.setdefault(case, {})[name] = us
    return med


def linear_config(n: int, k: int, num_tokens: int, prepared: bool = True):
    """The config ``nvfp4::linear`` launches for ``num_tokens`` tokens on ``[n, k]`` weights
    (``prepared``: by ``to_wfrag_``, read as wfrag + wperm), from whichever ``nvfp4_ops`` this
    process imported: the token tile and ``m_tiles`` as ``grouped_w4a16_gemm`` derives them.
    Written out with the older API on purpose (``linear_cuda.linear_config`` is newer):
    ``dev_ab_tree`` runs it against baseline trees that predate that function."""
    from nvfp4_ops.kernels import linear_cuda as L

    bm = L.block_m_for_tokens(num_tokens)
    return L.choose_config(n, k, bm, "none", False, False,
                           min(-(-num_tokens // bm), L._m_tiles_cap()), wperm=prepared,
                           wfrag=prepared)


def config_gemm(pick: Callable[..., object]):
    """A ``gemm`` for ``moe_cuda.moe_forward`` that launches the config ``pick(n, k, block_m,
    epilogue, m_tiles, kperm, pdl)`` returns (``m_tiles`` clamped as the op clamps it), or runs
    the op's own dispatch (``grouped_w4a16_gemm``) where it returns None."""
    from nvfp4_ops.kernels import linear_cuda as L

    def gemm(a, tile_expert, w, w_scale, w_global, out, *, epilogue, swiglu_limit, row_scale,
             bias, block_m, tile_rows, kperm=False, pdl=False, wperm=False):
        n, k = w.shape[1], a.shape[1]
        m_tiles = min(a.shape[0] // block_m, L._m_tiles_cap(True))
        cfg = pick(n, k, block_m, epilogue, m_tiles, kperm, pdl)
        if cfg is None:
            return L.grouped_w4a16_gemm(a, tile_expert, w, w_scale, w_global, out,
                                        epilogue=epilogue, swiglu_limit=swiglu_limit,
                                        row_scale=row_scale, bias=bias, block_m=block_m,
                                        tile_rows=tile_rows, kperm=kperm, pdl=pdl, wperm=wperm)
        L._launch(cfg, a, tile_expert, w, w_scale, w_global, out, swiglu_limit, row_scale, bias,
                  tile_rows)
    return gemm


def print_vs_first(title: str, med: dict[str, float], width: int = 52) -> None:
    """``title``, then each variant's median µs and the first variant's time over it."""
    first = next(iter(med.values()))
    print(title, flush=True)
    for name, us in med.items():
        print(f"  {name:{width}s} {us:8.1f} us  {first / us:6.3f}x", flush=True)
