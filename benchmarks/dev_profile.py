"""Run one W4A16 GEMM config a few times on fresh random data, for a profiler (ncu) to attach.

Usage (device): ``ncu --kernel-name regex:W4A16 --launch-skip 2 --launch-count 1 --section ...
python3 benchmarks/dev_profile.py linear N K M`` (``linear-wfrag``: on prepared weights, as the
vLLM glue runs it on CUDA), ``... wgmma N K M BLOCK_M ROW_WGS STAGES STREAMK [FIELD=VALUE ...]``
(that dense WGMMA tile on prepared weights; more ``WgmmaConfig`` fields as ints, e.g.
``decode=0``) or ``... grouped N K T EPILOGUE``: the config
is the dispatch's :func:`nvfp4_ops.kernels.linear_cuda.choose_config` choice (``block_m`` and
``m_tiles`` from the token count; grouped: k-permuted when the MoE would use it), grouped runs
use the real top-6 routing over 256 experts.
"""

from __future__ import annotations

import sys

import torch

from nvfp4_ops.kernels import linear_cuda
from nvfp4_ops.kernels.moe_cuda import choose_block_m
from nvfp4_ops.kernels.triton.moe_routing import moe_routing
from nvfp4_ops.testing import random_routing


def main() -> None:
    kind, n, k, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    wfrag = kind in ("linear-wfrag", "wgmma")  # random bytes: any order is valid data
    if kind == "wgmma":
        extra = {f: int(v) for f, v in (a.split("=") for a in sys.argv[9:])}
        run_tile(n, k, m, *(int(v) for v in sys.argv[5:9]), **extra)
        return
    kind = "linear" if wfrag else kind
    epi = sys.argv[5] if len(sys.argv) > 5 else "none"
    groups = 256 if kind == "grouped" else 1
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randint(0, 256, (groups, n, k // 2), dtype=torch.uint8, device="cuda",
                      generator=gen)
    s = (torch.rand(groups, n, k // 16, device="cuda", generator=gen) * 3 + 0.01).to(
        torch.float8_e4m3fn)
    g = torch.rand(groups, n, device="cuda", generator=gen) + 0.5
    n_out = n // 2 if epi == "swiglu" else n
    if kind == "grouped":
        bm = choose_block_m(m * 6, groups)
        ids, _ = random_routing(m, groups, 6, device="cuda")
        routing = moe_routing(ids, groups, 0, bm)
        te, tile_rows = routing.tile_expert, routing.tile_rows
        rows = te.numel() * bm
    else:
        bm, te, tile_rows, rows = linear_cuda.block_m_for_tokens(m), None, None, m
    a = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.empty(rows, n_out, dtype=torch.bfloat16, device="cuda")
    rs = torch.rand(rows, device="cuda") if epi == "row_scale" else None
    # the MoE's layout choice (random activations: their k order does not matter here)
    kperm = kind == "grouped" and linear_cuda.grouped_kperm(k, n_out, bm)
    m_tiles = min(-(-rows // bm), linear_cuda._m_tiles_cap(kind == "grouped"))
    print(linear_cuda.choose_config(n, k, bm, epi, False, kind == "grouped", m_tiles,
                                    kperm, wperm=wfrag, wfrag=wfrag).name, flush=True)
    for _ in range(4):
        linear_cuda.grouped_w4a16_gemm(a, te, w, s, g, out, epilogue=epi, swiglu_limit=10.0,
                                       row_scale=rs, block_m=bm, kperm=kperm,
                                       tile_rows=tile_rows, wperm=wfrag, wfrag=wfrag)
    torch.cuda.synchronize()


def run_tile(n: int, k: int, m: int, block_m: int, row_wgs: int, stages: int,
             streamk: int, **extra: int) -> None:
    """A dense WGMMA tile (``none`` epilogue) on random wfrag + wperm weights, 4 launches;
    ``extra``: more :class:`~nvfp4_ops.kernels.cute.w4a16_wgmma.WgmmaConfig` fields."""
    from nvfp4_ops.kernels.cute.w4a16_wgmma import WgmmaConfig

    cfg = WgmmaConfig(n, k, "none", False, False, block_m, row_wgs, 1, stages, wfrag=True,
                      wperm=True, streamk=streamk, **extra)
    print(cfg.name, flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randint(0, 256, (1, n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    s = (torch.rand(1, n, k // 16, device="cuda", generator=gen) * 3 + 0.01).to(
        torch.float8_e4m3fn)
    g = linear_cuda.per_row_global_view(torch.rand(n, device="cuda", generator=gen) + 0.5, n)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(4):
        linear_cuda._launch(cfg, a, None, w, s, g, out, None, None, None)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
