"""CUDA glue from the ``nvfp4::linear`` / ``nvfp4::mlp`` op arguments to the W4A16 GEMM.

Also the torch-facing grouped GEMM (:func:`grouped_w4a16_gemm`) that the fused MoE reuses, the
variant enumeration behind :func:`nvfp4_ops.warmup` / ``python -m nvfp4_ops precompile``, and
the token-tile choice. Everything is CUDA-graph safe: no host syncs, grid sizes from static
shapes only, launches on torch's current stream (tvm-ffi reads it at call time). The dense
stream-K tiles' counters are the one cached buffer (:func:`streamk_counters`): keyed by the
stream, or under capture by the capture and its stream, never shared by launches that could
overlap.

Global scales reach the kernels as fp32 ``[G, H2, N / H2]`` *views* of the op arguments
(``H2 = 2`` for the SwiGLU GEMM: gate half, up half; 1 otherwise; any strides, 0 where one
scale covers many rows; :mod:`nvfp4_ops.kernels.cute.gemm_interface`), built by
:func:`per_row_global_view`, :func:`per_group_global_view` and :func:`gate_up_global_view`:
no per-call expansion kernel, no cache of expanded rows.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from collections.abc import Iterable

import torch

from nvfp4_ops import _compile
from nvfp4_ops.kernels.kperm import KPERM, NATURAL, PAIR

__all__ = [
    "BLOCK_MS",
    "block_m_for_tokens",
    "compiled_gemm",
    "config_layout",
    "grouped_layout",
    "dense_m_tiles",
    "gate_up_global_view",
    "grouped_kperm",
    "grouped_w4a16_gemm",
    "linear",
    "mlp",
    "per_group_global_view",
    "per_row_global_view",
    "reach_m_tiles",
    "run_once",
    "variants_for_shapes",
]

#: Kernel families (modules under ``nvfp4_ops.kernels.cute``). Every family has the same call
#: interface (see ``w4a16_gemm.W4A16GroupedGemm``) plus ``BLOCK_MS``, ``choose_config``,
#: ``compile_gemm`` and ``supported``. The ``mma.sync`` kernel (``w4a16_gemm``) covers every
#: ``N_out % 16, K % 128`` problem and is the fallback for shapes another family refuses.
_STREAM = "w4a16_stream"  # 1-8 tokens: weights streamed global -> smem by the bulk-copy engine
_MMA = "w4a16_gemm"  # 9-32 tokens (dense): mma.sync from a register ring
_WGMMA = "w4a16_wgmma"  # 16-256 tokens per tile on the tensor cores' async path
_FALLBACK = _MMA
#: the permuted activation order each family reads with ``kperm`` (:mod:`nvfp4_ops.kernels.kperm`)
_KPERM_LAYOUT = {_STREAM: PAIR, _WGMMA: KPERM}
#: every token tile some family serves (dense and grouped; the MoE routing pads to one of these)
BLOCK_MS = (8, 16, 32, 64, 128, 256)
_dummies: dict[tuple, torch.Tensor] = {}


def _family(block_m: int, grouped: bool) -> str:
    """Which family serves a token tile (H200 measurements, benchmarks/results/):

    * 8: the streamed kernel (linear M=1 at (7168, 18432) 34.8 vs 36.2 us for mma.sync, MoE
      V4-Flash T=1 GEMM pair 48.8 vs 54.3 us; stream_dev_h200.txt);
    * dense 16-32: mma.sync (the streamed kernel was 0.8-0.9x of it there; the WGMMA kernel
      has too few CTAs);
    * grouped 16-32 and everything from 64: WGMMA (V4-Flash T=512 whole MoE op 2073 us at
      block_m 16, 2260 at 32, 2812 with the 8-token streamed tile; linear M=8192 615 TFLOP/s;
      h200_2026-11-30_s3/wgmma_ab_h200.txt, wgmma_dev_h200.txt).
    """
    if block_m <= 8:
        return _STREAM
    if block_m <= 32 and not grouped:
        return _MMA
    return _WGMMA


def _kernel_module(name: str):
    _compile.ensure_cutlass_env()
    return importlib.import_module(f"nvfp4_ops.kernels.cute.{name}")


def _gemm_module():
    return _kernel_module(_FALLBACK)


def _covers(mod, n_out: int, k: int, block_m: int) -> bool:
    return block_m in mod.BLOCK_MS and mod.supported(n_out, k)


@functools.cache
def choose_config(n: int, k: int, block_m: int, epilogue: str = "none",
                  has_bias: bool = False, grouped: bool = False, m_tiles: int | None = None,
                  kperm: bool = False, pdl: bool = False, wperm: bool = False,
                  wfrag: bool = False):
    """:func:`_choose_config`, then with ``wfrag`` (the weights' codes in the MMA-fragment
    order of :mod:`nvfp4_ops.kernels.wfrag`, natural activations) and / or
    ``wperm`` (the bit order of :mod:`nvfp4_ops.kernels.wperm`) the same config reading that
    order.

    Raises:
        ValueError: as :func:`_choose_config`; ``wfrag`` with ``kperm`` (permuted activations
            are the other way to meet the fragments); or ``wperm`` for a config that decodes
            with something else than ``pair4`` (:func:`reads_wperm`).
    """
    cfg = _choose_config(n, k, block_m, epilogue, has_bias, grouped, m_tiles, kperm, pdl)
    if wfrag:
        if kperm:
            raise ValueError("wfrag weights are read with natural activations, not kperm")
        cfg = (_streamk_tile(cfg, m_tiles) or _wfrag_small_tile(cfg)
               or dataclasses.replace(cfg, wfrag=True))
        if _stream_tma2d(cfg):
            cfg = dataclasses.replace(cfg, tma2d=True)
    if wperm:
        if not reads_wperm(cfg):
            raise ValueError(f"no kernel reads wperm weights for N={n}, K={k}, "
                             f"block_m={block_m}, grouped={grouped}, kperm={kperm}")
        cfg = dataclasses.replace(cfg, wperm=True)
    return cfg


def config_family(cfg) -> str:
    """The kernel family (module name under ``kernels/cute``) a config of any family belongs to:
    ``w4a16_stream``, ``w4a16_gemm`` or ``w4a16_wgmma``."""
    return type(cfg).__module__.rsplit(".", 1)[1]


#: stream-K WGMMA tiles for dense problems on ``wfrag`` weights (:func:`_streamk_tile`):
#: ``block_m -> (row_wgs, stages, CTAs per SM)``, with 64-k stages
STREAMK_TILES = {16: (1, 6, 3), 32: (1, 6, 3), 128: (2, 8, 1)}
#: ring stages of the same tiles with 128-k stages (``WgmmaConfig.stage_k``), used when
#: K % 128 == 0
STREAMK_WIDE_STAGES = 4
#: stream-K is used when every CTA gets at least this many 64-k tiles (the fix-up of partial
#: tiles is then a small part of its work; both shapes measured have 81-122)
STREAMK_MIN_K_TILES = 64


def _streamk_tile(cfg, m_tiles: int | None):
    """The stream-K WGMMA tile (``WgmmaConfig.streamk``: every SM gets the same share of the
    (output tile, k tile) units) for a dense ``none`` problem (bias allowed) on ``wfrag``
    weights at 16 or 32 tokens (in place of ``mma.sync`` or the wide one-tile-per-CTA tile)
    or 128 tokens with at most two token tiles, when each CTA gets >=
    :data:`STREAMK_MIN_K_TILES` 64-k tiles; else None. With K % 128 == 0 the tile streams
    128-k stages (:data:`STREAMK_WIDE_STAGES`).

    H200, median µs on wfrag + wperm weights (benchmarks/results/h200_2026-12-01_s9/:
    ``grid/grid_v2.log`` and ``sk_wgmma/ab_final.log`` after the loop fix, ``sk_wgmma/
    ab_32_199.log`` before it):
    * M = 128, two row warpgroups, 8 stages, 132 CTAs: (18432, 7168) 66.3 vs 73.3 for three
      row warpgroups (96 CTAs, the previous choice); (7168, 18432) 67.7 vs 76.3 for ``r1 s2``;
    * M = 199: 117.2 vs 121.0 (``r2 s2``) at (7168, 18432); before the fix 127.7 vs 141.1
      (r3) at (18432, 7168);
    * M = 16, one row warpgroup, 396 CTAs: (18432, 7168) 43.1 vs 49.3 for the 6-stage
      one-tile-per-CTA tile; (7168, 18432) 44.0 vs 42.2 for ``mma.sync`` with 4 stages (s9).
      With the quad-shared block scales (s11, ``h200_2026-12-01_s11/ab/ab_small_*.log``, two
      runs): 6 stages 41.0 / 41.0 vs ``mma.sync`` 42.0 / 41.9 at (7168, 18432), so the
      stream-K tile now takes N = 7168 too; 39.8 / 39.8 vs 4 stages 41.5 / 41.5 at
      (18432, 7168); 5 and 8 stages within 0.3 of 6;
    * M = 32: (7168, 18432) 6 stages 44.6 / 44.4 vs 4 stages 45.1 / 45.3 vs ``mma.sync``
      74.7 / 74.4; (18432, 7168) 42.7 / 42.6 vs 44.4 / 44.3 (s11).
    * 128-k stages (``stage_k=128``, block scales by TMA; session 13, ``h200_2026-12-01_s13/
      ab/ab_ss2.log``, 4 stages vs the 64-k tiles above, ``dev_ab_wfrag --flush read``):
      M = 16 37.2 vs 41.0 (7168, 18432), 36.6 vs 39.4 (18432, 7168); M = 32 40.7 vs 44.5,
      40.0 vs 42.8; M = 128 60.8 vs 67.6, 60.0 vs 64.8. 3 and 5 stages within 1 µs of 4.
    * With the acquire-release fix-up (``lite_fixup``) and one scale load per lane and
      stage instead of per 64-k tile (session 14, ``h200_2026-12-01_s14/ab/``, same
      method): M = 16 35.6-36.1 vs 36.5-37.3 (6 runs), M = 32 39.3-40.4 vs 39.9-40.7 (3),
      M = 128 59.1-59.4 vs 60.1-60.9 (1). 5 and 6 stages were no faster, 8 slower
      (37.7-38.8 at M = 16).
    * Session 15 (``h200_2026-12-01_s15/``, ``bench_linear``, two alternating rounds each):
      the block scales a stage ahead (``scale_ahead``, 16-32 tokens) M = 16 32.6-33.1 ->
      31.8-32.1 µs, M = 32 37.0-38.1 -> 36.5-36.9 (``validate/``); then the counters reused
      (:func:`streamk_counters`) 31.7-32.0 -> 30.9-31.4 at M = 16, and launch overlap
      (``pdl``, every stream-K tile) 29.9-30.1 at M = 16, 33.5-34.2 at M = 32, 56.3-57.6 at
      M = 128 (``pdl/``). K % 128 != 0 never reaches this tile: :func:`supported` sends
      such shapes to the reference.
    """
    if cfg.grouped or cfg.epilogue != "none" or m_tiles is None:
        return None
    family = config_family(cfg)
    if not ((family == _MMA and cfg.block_m in (16, 32))
            or (family == _WGMMA and cfg.block_m == 128 and m_tiles <= 2)):
        return None
    wg = _kernel_module(_WGMMA)
    row_wgs, stages, per_sm = STREAMK_TILES[cfg.block_m]
    if cfg.n % (64 * row_wgs) != 0 or not wg.supported(cfg.n, cfg.k):
        return None
    tile = wg.WgmmaConfig(cfg.n, cfg.k, "none", cfg.has_bias, False, cfg.block_m, row_wgs, 1,
                          stages, wfrag=True, streamk=per_sm)
    _, units = tile.streamk_units(m_tiles * cfg.block_m)
    if units < STREAMK_MIN_K_TILES * wg.NUM_SMS * per_sm:
        return None
    if cfg.k % 128 == 0:
        ahead = cfg.block_m <= 32
        tile = dataclasses.replace(tile, stage_k=128, stages=STREAMK_WIDE_STAGES,
                                   lite_fixup=True, scale_ahead=ahead)
    return dataclasses.replace(tile, pdl=True)


def _stream_tma2d(cfg) -> bool:
    """Whether a dense streamed config on ``wfrag`` weights fills its stages with two TMA
    tensor copies (``StreamConfig.tma2d``) instead of two bulk copies per weight row: when
    each CTA streams at least :data:`TMA2D_MIN_CHUNKS` K chunks, or all CTAs fit in one per SM.

    H200, ``bench_linear`` (rotating weight sets, CUDA graphs), median µs over three
    alternating rounds, bulk copies -> ``tma2d``, M = 1 / 8 (benchmarks/results/
    h200_2026-12-01_s12/README.md): (7168, 18432) (18 chunks) 29.2-29.6 -> 26.7-26.9 /
    39.5-39.7 -> 34.9-35.3; (1536, 4096) (96 CTAs) 6.0-6.2 -> 5.3-5.5 / 6.1-6.3 -> 5.7-5.9;
    but (18432, 7168) (7 chunks, 1152 CTAs) 28.8-29.1 -> 29.4-29.7 / 39.4-39.7 -> 40.3-40.6
    and (4096, 4096) (4 chunks, 256 CTAs) 7.2-7.4 -> 7.5-7.7. Bitwise the same outputs."""
    if config_family(cfg) != _STREAM or cfg.epilogue != "none" or not cfg.tma2d_allowed:
        return False
    ctas = cfg.n_out // cfg.rows_out
    return cfg.k >= TMA2D_MIN_CHUNKS * cfg.kc or ctas <= _kernel_module(_WGMMA).NUM_SMS


#: :func:`_stream_tma2d`: K chunks per CTA from which the TMA tensor copies pay
TMA2D_MIN_CHUNKS = 16


def _wfrag_small_tile(cfg):
    """The one-warpgroup 6-stage WGMMA tile for a dense 16 / 32-token ``mma.sync`` problem on
    ``wfrag`` weights whose 64-row blocks fill two waves (N >= 2 * 64 * SMs; no bias, no
    epilogue), else None. H200 A/B runs (benchmarks/results/h200_2026-12-01_s8/ab/), median
    µs at N = 18432, K = 7168, M = 16 / 32: 4 stages 58.1 / 58.5 vs 70.9 / 94.6 for
    ``mma.sync`` on the same weights (62.0 / 94.7 on checkpoint order; ``ab_wfrag.log``); 6
    stages 51.3 / 54.1 vs 4 stages 53.7 / 55.9, 8 stages 51.5 / 58.8 (``small_sweep.log``). At
    N = 7168 (112 CTAs) it is ~2x slower than ``mma.sync`` (94.0 vs 49.7 at M = 16)."""
    if config_family(cfg) != _MMA or cfg.grouped:
        return None
    wg = _kernel_module(_WGMMA)
    if (cfg.block_m not in (16, 32) or cfg.epilogue != "none" or cfg.has_bias
            or cfg.n < 2 * 64 * wg.NUM_SMS or not wg.supported(cfg.n, cfg.k)):
        return None
    return wg.WgmmaConfig(cfg.n, cfg.k, "none", False, False, cfg.block_m, 1, 1, 6, wfrag=True)


def reads_wperm(cfg) -> bool:
    """Whether a config's kernel can read weights in the ``wperm`` bit order (its decoder is
    ``pair4`` on whole u32 words: the streamed family, the WGMMA family with ``kperm``, and
    every family with ``wfrag``)."""
    family = config_family(cfg)
    return (family == _STREAM or getattr(cfg, "wfrag", False)
            or (family == _WGMMA and getattr(cfg, "kperm", False)))


def _choose_config(n: int, k: int, block_m: int, epilogue: str = "none",
                   has_bias: bool = False, grouped: bool = False, m_tiles: int | None = None,
                   kperm: bool = False, pdl: bool = False):
    """The kernel config for a GEMM problem (static sizes only, so cached through
    :func:`choose_config`: it runs on every launch): the family of :func:`_family` when it
    covers the shape, else the ``mma.sync`` kernel, at the same ``block_m`` when it has it,
    else (dense only: any tile is valid there) its largest.
    ``m_tiles`` (``ceil(P / block_m)``, clamped by :func:`_m_tiles_cap`) lets the WGMMA family
    size a dense tile shape to the number of CTAs (``w4a16_wgmma.choose_config``) and the
    streamed family pick persistent CTAs for a grouped problem with few token tiles (decode).
    ``kperm`` (grouped only): the activations are in the permuted order of the family that
    serves the tile (``pair`` for the streamed 8-token tiles, ``kperm`` for the WGMMA tiles:
    :func:`grouped_layout`, which the gather follows) and a
    SwiGLU output is written in it; see :func:`grouped_kperm`. ``pdl`` (grouped only): the
    call is part of the MoE chain (see :func:`grouped_w4a16_gemm`), so the streamed family and
    the WGMMA family (with ``kperm``) may overlap the previous kernel (``w4a16_stream``,
    "Launch overlap"); the ``mma.sync`` fallback ignores it (a plain launch is always
    correct).

    Raises:
        ValueError: a grouped problem no family covers at ``block_m`` (see
            :func:`grouped_supported`; the MoE routing pads to ``block_m``, so the tile cannot
            change), or ``kperm`` where the family does not cover the problem (no fallback
            reads a permuted order).
    """
    n_out = n // 2 if epilogue == "swiglu" else n
    family = _family(block_m, grouped)
    mod = _kernel_module(family)
    if kperm:
        if not (grouped and family in _KPERM_LAYOUT and _covers(mod, n_out, k, block_m)):
            raise ValueError(f"no kernel reads k-permuted activations for N={n}, K={k}, "
                             f"block_m={block_m}, grouped={grouped}")
        if family == _STREAM:
            return mod.choose_config(n, k, block_m, epilogue, has_bias, grouped, m_tiles,
                                     kperm=True, pdl=pdl)
        return mod.choose_config(n, k, block_m, epilogue, has_bias, grouped, kperm=True,
                                 pdl=pdl)
    if _covers(mod, n_out, k, block_m):
        if grouped and family == _STREAM:
            return mod.choose_config(n, k, block_m, epilogue, has_bias, grouped, m_tiles,
                                     pdl=pdl)
        if m_tiles is not None and not grouped and family == _WGMMA:
            return mod.choose_config(n, k, block_m, epilogue, has_bias, grouped, m_tiles)
        return mod.choose_config(n, k, block_m, epilogue, has_bias, grouped)
    fallback = _gemm_module()
    if block_m not in fallback.BLOCK_MS:
        if grouped:
            raise ValueError(f"no kernel covers grouped N_out={n_out}, K={k} at block_m={block_m}")
        block_m = max(fallback.BLOCK_MS)
    return fallback.choose_config(n, k, block_m, epilogue, has_bias, grouped)


@functools.cache
def grouped_supported(n_out: int, k: int, block_m: int) -> bool:
    """Whether a grouped GEMM with token tile ``block_m`` covers ``(N_out, K)``."""
    return (_covers(_kernel_module(_family(block_m, True)), n_out, k, block_m)
            or _covers(_gemm_module(), n_out, k, block_m))


@functools.cache
def grouped_kperm(hidden_size: int, inter: int, block_m: int) -> bool:
    """Whether the MoE's two grouped GEMMs at ``block_m`` (gate/up: ``N = 2I, K = H``; down:
    ``N = H, K = I``) both run a family that reads a permuted activation order (WGMMA: the
    32-block ``kperm`` order; the streamed 8-token tiles: the 8-block ``pair`` order), so they
    take their activations in it (the gather and GEMM 1's epilogue write them;
    :func:`grouped_layout` says which order). False when either GEMM
    falls back to ``mma.sync`` (e.g. ``K % 256`` at block_m 8)."""
    family = _family(block_m, True)
    if family not in _KPERM_LAYOUT:
        return False
    mod = _kernel_module(family)
    return _covers(mod, inter, hidden_size, block_m) and _covers(mod, hidden_size, inter, block_m)


@functools.cache
def grouped_layout(block_m: int) -> str:
    """The permuted activation order (a :data:`nvfp4_ops.kernels.kperm.LAYOUTS` name) the family
    serving a grouped ``block_m`` tile reads (``pair`` for the streamed 8-token tiles, ``kperm``
    for the WGMMA tiles; ``natural`` for a family without one): what the gather writes for
    ``kperm=True``. Derived from :func:`_family`, so the dispatch and the gather cannot
    disagree. Only meaningful where :func:`grouped_kperm` is true."""
    return _KPERM_LAYOUT.get(_family(block_m, True), NATURAL)


def config_layout(cfg) -> str:
    """The activation order a config of any family reads (a
    :data:`nvfp4_ops.kernels.kperm.LAYOUTS` name): ``natural``, or its family's permuted
    order (``pair`` for the streamed family, ``kperm`` for WGMMA)."""
    if not getattr(cfg, "kperm", False):
        return "natural"
    return _KPERM_LAYOUT[config_family(cfg)]


def block_m_for_tokens(num_tokens: int) -> int:
    """Token tile for a dense linear of ``num_tokens`` rows (static: from the shape only).

    Up to 64 tokens: the smallest tile that holds them. Then 128 up to 256 tokens (one or two
    m-tiles; the WGMMA config choice fills the SMs with split-K / row warpgroups), 256 beyond:
    half the weight decode per token. H200, best config per tile (benchmarks/results/
    h200_2026-11-30_s3/wgmma_sweep_h200.txt): M=512 at (7168, 18432) 203.9 us with 256 vs
    256.3 with 128, (18432, 7168) 240.1 vs 291.5, (4096, 4096) 27.9 vs 33.9; M=8192 615 vs
    460 TFLOP/s (benchmarks/results/wgmma_dev_h200.txt).
    """
    for bm in (8, 16, 32, 64):
        if num_tokens <= bm:
            return bm
    return 128 if num_tokens <= 256 else 256


def supported(n_out: int, k: int) -> bool:
    """Shapes the kernel covers (N_out % 16, K % 128); others run the exact reference."""
    return n_out % 16 == 0 and k % 128 == 0


def compiled_gemm(cfg):
    """The binary for a kernel config of any family (cached; the family is the module that
    defines the config's class)."""
    _compile.ensure_cutlass_env()
    mod = importlib.import_module(type(cfg).__module__)
    return _compile.get_compiled(cfg, lambda: mod.compile_gemm(cfg))


def _dummy(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    key = (dtype, device)
    t = _dummies.get(key)
    if t is None:
        t = torch.zeros(1, dtype=dtype, device=device)
        _dummies[key] = t
    return t


def _aligned(t: torch.Tensor, align: int = 16) -> torch.Tensor:
    t = t.contiguous()
    if t.data_ptr() % align != 0:
        t = t.clone()
    return t


def _global_halves(epilogue: str) -> int:
    """``H2`` of a GEMM's global-scale argument: 2 for ``swiglu`` (gate, up halves), else 1
    (``gemm_interface.global_halves``, which this module does not import: it loads cutlass)."""
    return 2 if epilogue == "swiglu" else 1


def per_row_global_view(w_global: torch.Tensor, n: int, halves: int = 1) -> torch.Tensor:
    """Per-row global scales fp32 ``[G, N]`` (or ``[N]``: one group) as the kernels' ``[G, H2,
    N / H2]`` (``H2 = halves``: 2 for a SwiGLU GEMM, rows ``[0, N/2)`` gate, ``[N/2, N)`` up).

    A view (same storage, any input strides kept: ``(s0, s1 * N/H2, s1)``); never a copy.

    Raises:
        ValueError: not fp32 ``[G, N]`` / ``[N]``, or ``N`` not a multiple of ``halves``.
    """
    if w_global.dim() == 1:
        w_global = w_global.unsqueeze(0)
    if (w_global.dim() != 2 or w_global.shape[1] != n or n % halves != 0
            or w_global.dtype != torch.float32):
        raise ValueError(f"per-row global scales must be fp32 [G, {n}] or [{n}] with N "
                         f"divisible by {halves}, got {w_global.dtype} {tuple(w_global.shape)}")
    return w_global.unflatten(1, (halves, n // halves))


def per_group_global_view(scale: torch.Tensor, n: int) -> torch.Tensor:
    """One global scale per group (per-tensor: ``[]``; per expert: fp32 ``[G]``) as the
    kernels' ``[G, 1, N]`` (``[1, 1, N]`` for ``[]``): every row of group ``g`` reads
    ``scale[g]``. A view: strides ``(s0, s0, 0)`` (``(0, 0, 0)`` for ``[]``), same storage.

    Raises:
        ValueError: not fp32 ``[]`` / ``[G]``.
    """
    if scale.dim() > 1 or scale.dtype != torch.float32:
        raise ValueError(f"a per-group global scale must be fp32 [] or [G], got {scale.dtype} "
                         f"{tuple(scale.shape)}")
    if scale.dim() == 0:
        return scale.expand(1, 1, n)
    return scale.reshape(-1, 1, 1).expand(scale.shape[0], 1, n)


def gate_up_global_view(scale: torch.Tensor, inter: int) -> torch.Tensor:
    """A gate and an up global scale per group (fp32 ``[G, 2]``, or ``[2]``: one group) as the
    SwiGLU GEMM's ``[G, 2, I]``: gate rows ``[0, I)`` read ``scale[g, 0]``, up rows ``[I, 2I)``
    ``scale[g, 1]`` (kept separate, never folded). A view: strides ``(s0, s1, 0)``, same
    storage. Per-row scales (``[G, 2I]`` / ``[2I]``) go through :func:`per_row_global_view`
    with two halves.

    Raises:
        ValueError: not fp32 ``[G, 2]`` / ``[2]`` / ``[G, 2I]`` / ``[2I]``.
    """
    if scale.shape[-1] == 2 * inter != 2:
        return per_row_global_view(scale, 2 * inter, halves=2)
    if scale.dim() == 1:
        scale = scale.unsqueeze(0)
    if scale.dim() != 2 or scale.shape[1] != 2 or scale.dtype != torch.float32:
        raise ValueError(f"gate/up global scales must be fp32 [G, 2] or [2], got {scale.dtype} "
                         f"{tuple(scale.shape)}")
    return scale.unsqueeze(2).expand(scale.shape[0], 2, inter)


def grouped_w4a16_gemm(
    a: torch.Tensor,
    tile_expert: torch.Tensor | None,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    w_global: torch.Tensor,
    out: torch.Tensor,
    *,
    epilogue: str = "none",
    swiglu_limit: float | None = None,
    row_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    block_m: int = 16,
    kperm: bool = False,
    tile_rows: torch.Tensor | None = None,
    pdl: bool = False,
    wperm: bool = False,
    wfrag: bool = False,
) -> None:
    """``out[p] = epilogue(a[p] @ (e2m1 * w_scale)[g]^T * w_global[g])`` for the m-tile's group g.

    Args:
        a: bf16 ``[P, K]`` (rows grouped by expert, each segment padded to ``block_m``).
        tile_expert: int32 ``[ceil(P / block_m)]`` local group per m-tile, ``-1`` = skip (its
            rows are not written); None = one group, every tile valid (linear / MLP).
        w: uint8 ``[G, N, K/2]``; w_scale: float8_e4m3fn (or its uint8 view) ``[G, N, K/16]``;
        w_global: fp32 global scale per weight row, ``[G, N]`` (``[N]`` when ``w`` is 2-D) or
            the kernels' own ``[G, H2, N / H2]`` (``H2 = 2`` for ``swiglu``: gate half, up
            half; else 1), any strides, 0 included (see :func:`per_row_global_view`,
            :func:`per_group_global_view`, :func:`gate_up_global_view`): passed as a view,
            never copied.
        out: bf16 ``[P, N_out]``, preallocated; ``N_out = N/2`` for ``swiglu``.
        epilogue: ``"none"`` (+ optional ``bias`` bf16 ``[N]``), ``"swiglu"`` (gate rows
            ``[0, N/2)``, up rows ``[N/2, N)``; ``silu(min(gate, L)) * clamp(up, -L, L)`` in fp32),
            ``"row_scale"`` (``* row_scale[p]``, fp32 ``[P]``).
        swiglu_limit: ``L`` or None (no clamp).
        block_m: token tile (one of :data:`BLOCK_MS`); static.
        kperm: ``a`` is in the permuted k order of the family serving ``block_m``
            (``pair`` at 8, ``kperm`` at 16-256: :func:`grouped_layout`)
            and a ``swiglu`` output is written in it; grouped problems that family covers
            only (:func:`grouped_kperm`).
        tile_rows: int32 ``[ceil(P / block_m)]`` (grouped only): real rows at the start of each
            m-tile, the rest being padding whose outputs may be any function of the tile's
            rows (the streamed kernel copies the last real row's; see ``w4a16_gemm``'s module
            docstring). None = every row is real.
        pdl: the call is GEMM 1 or 2 of the MoE chain (``moe_cuda``): ``tile_expert`` was
            written by a kernel at least two launches back, and the previous kernel waits for
            its own predecessor in every CTA before it lets this one launch (the gather, or
            GEMM 1 for GEMM 2). The streamed family then overlaps the previous kernel
            (``w4a16_stream``, "Launch overlap"). Not for other callers: a kernel that wrote
            ``tile_expert`` just before could still be running.
        wperm: ``w`` holds its codes in the bit order of :mod:`nvfp4_ops.kernels.wperm`
            (configs that read it only: :func:`reads_wperm`).
        wfrag: ``w`` holds its codes in the MMA-fragment order of
            :mod:`nvfp4_ops.kernels.wfrag` (natural ``a``, not with ``kperm``).

    Requires ``N_out % 16 == 0`` and ``K % 128 == 0`` (see :func:`supported`).

    Raises:
        ValueError: wrong shapes/dtypes, or an unsupported size.
    """
    if w.dim() == 2:
        w, w_scale = w.unsqueeze(0), w_scale.unsqueeze(0)
    num_rows, k = a.shape
    groups, n, k_half = w.shape
    if k_half * 2 != k or tuple(w_scale.shape) != (groups, n, k // 16):
        raise ValueError(f"shape mismatch: a {tuple(a.shape)}, w {tuple(w.shape)}, "
                         f"w_scale {tuple(w_scale.shape)}")
    halves = _global_halves(epilogue)
    if w_global.dim() in (1, 2) and w_global.shape[-1] == n and n % halves == 0:
        w_global = per_row_global_view(w_global, n, halves)
    if (tuple(w_global.shape) != (groups, halves, n // halves) or n % halves != 0
            or w_global.dtype != torch.float32):
        raise ValueError(f"w_global must be fp32 [G, N] = [{groups}, {n}] or [G, H2, N/H2] = "
                         f"[{groups}, {halves}, {n // halves}] ({epilogue!r} epilogue), got "
                         f"{w_global.dtype} {tuple(w_global.shape)}")
    if a.dtype != torch.bfloat16 or out.dtype != torch.bfloat16 or w.dtype != torch.uint8:
        raise ValueError("a/out must be bf16 and w uint8")
    n_out = n // 2 if epilogue == "swiglu" else n
    if out.shape[0] < num_rows or out.shape[1] != n_out or not out.is_contiguous():
        raise ValueError(f"out must be contiguous bf16 [>= {num_rows}, {n_out}]")
    if not supported(n_out, k):
        raise ValueError(f"unsupported size N_out={n_out}, K={k} (needs N_out%16, K%128)")
    if epilogue == "row_scale" and (row_scale is None or row_scale.shape[0] < num_rows):
        raise ValueError("row_scale epilogue needs row_scale fp32 [P]")
    if tile_rows is not None and (tile_expert is None or tile_rows.dtype != torch.int32
                                  or tile_rows.shape != tile_expert.shape):
        raise ValueError("tile_rows must be int32 shaped like tile_expert (grouped calls only)")
    if num_rows == 0:
        return
    cfg = launch_config(n, k, num_rows, block_m, epilogue, bias is not None,
                        tile_expert is not None, kperm, pdl, wperm, wfrag)
    _launch(cfg, a, tile_expert, w, w_scale, w_global, out, swiglu_limit, row_scale, bias,
            tile_rows)


def launch_config(n: int, k: int, num_rows: int, block_m: int, epilogue: str = "none",
                  has_bias: bool = False, grouped: bool = False, kperm: bool = False,
                  pdl: bool = False, wperm: bool = False, wfrag: bool = False):
    """The config :func:`grouped_w4a16_gemm` launches for ``num_rows`` rows in ``block_m``
    tiles (arguments as there; ``pdl`` applies to grouped calls only): :func:`choose_config`
    with the token-tile count clamped by :func:`_m_tiles_cap`. Static sizes only."""
    m_tiles = min(-(-num_rows // block_m), _m_tiles_cap(grouped))
    return choose_config(n, k, block_m, epilogue, has_bias, grouped, m_tiles, kperm,
                         pdl and grouped, wperm, wfrag)


def linear_config(n: int, k: int, num_tokens: int, has_bias: bool = False,
                  wfrag: bool = False):
    """The config ``nvfp4::linear`` launches on CUDA for ``num_tokens`` rows of ``[n, k]``
    weights (``wfrag``: prepared by ``nvfp4::to_wfrag_``, read as wfrag + wperm)."""
    return launch_config(n, k, num_tokens, block_m_for_tokens(num_tokens), "none", has_bias,
                         wperm=wfrag, wfrag=wfrag)


def _launch(cfg, a, tile_expert, w, w_scale, w_global, out, swiglu_limit, row_scale, bias,
            tile_rows=None):
    """Run the binary of ``cfg`` (arguments as :func:`grouped_w4a16_gemm`, already checked;
    ``w_global`` ``[G, N]`` or ``[G, H2, N / H2]``, passed on as a view whatever its strides;
    a grouped call without ``tile_rows`` gets ``block_m`` real rows in every tile)."""
    fn = compiled_gemm(cfg)
    dev = a.device
    if w_scale.dtype != torch.uint8:
        w_scale = w_scale.view(torch.uint8)
    if w_global.dim() == 2:
        w_global = w_global.unflatten(1, (_global_halves(cfg.epilogue), -1))
    if getattr(cfg, "streamk", 0):
        # a dense stream-K kernel takes its counters and scratch in these two slots
        tile_expert, tile_rows = streamk_scratch(cfg, a.shape[0], dev)
    fn(
        _aligned(a),
        _aligned(w),
        _aligned(w_scale),
        w_global,
        out,
        tile_expert.contiguous() if tile_expert is not None else _dummy(torch.int32, dev),
        _tile_rows(tile_rows, tile_expert, cfg.block_m, dev),
        row_scale.float().contiguous() if row_scale is not None else _dummy(torch.float32, dev),
        bias.contiguous() if bias is not None else _dummy(torch.bfloat16, dev),
        float("inf") if swiglu_limit is None else float(swiglu_limit),
    )


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def streamk_scratch(cfg, num_rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(counters, scratch)`` for a dense stream-K WGMMA config (``WgmmaConfig.streamk`` CTAs
    per SM; :mod:`nvfp4_ops.kernels.cute.streamk`): int32 zeros, one per output tile
    (:func:`streamk_counters`), and int32 words for two fp32 partial sums per CTA, whose
    number the kernel reads off the scratch's length: ``min(units, SMs * streamk)`` CTAs for
    ``units`` (tile, K unit) pairs. The scratch is allocated per call (no kernel touches it
    before writing it)."""
    items, units = cfg.streamk_units(num_rows)
    ctas = min(units, _sm_count(device) * cfg.streamk)
    return (streamk_counters(items, device),
            torch.empty(ctas * 2 * cfg.partial_len, dtype=torch.int32, device=device))


#: ``NVFP4_OPS_STREAMK_COUNTERS``: ``reuse`` (default) or ``per-call`` (:func:`streamk_counters`)
STREAMK_COUNTERS_ENV = "NVFP4_OPS_STREAMK_COUNTERS"
_counters: dict[tuple, torch.Tensor] = {}


def streamk_counters(items: int, device: torch.device) -> torch.Tensor:
    """Zeroed int32 tile counters ``[items]`` for a stream-K launch on the current stream.

    The kernel leaves its counters at zero (each tile's last piece resets its own), so one
    buffer serves every launch that cannot overlap another one using it:
    * eager: one buffer per (device, stream, ``items``), zeroed once when first made;
    * under CUDA-graph capture: one per (capture, capturing stream, ``items``), made (and its
      zeroing captured) at the first call of that capture; each replay zeroes it once, at
      that point. Launches in different graphs, on different streams or on different branches
      of one capture never share a buffer; those sharing one are ordered by their stream.
    Why: a fresh buffer per call puts a memset before every stream-K kernel (a graph node
    that also keeps launch overlap from reaching the kernel); on H200 ``bench_linear`` M = 16
    took 0.05-0.9 us less without it, median 0.8 over 8 pairs (benchmarks/results/
    h200_2026-12-01_s15/persist, pdl).
    ``NVFP4_OPS_STREAMK_COUNTERS=per-call`` restores a fresh zeroed buffer per call.

    Raises:
        ValueError: the environment variable holds something else.
    """
    mode = os.environ.get(STREAMK_COUNTERS_ENV, "reuse")
    if mode not in ("reuse", "per-call"):
        raise ValueError(f"{STREAMK_COUNTERS_ENV} must be 'reuse' or 'per-call', got {mode!r}")
    stream = torch.cuda.current_stream(device)
    if mode == "reuse" and torch.cuda.is_current_stream_capturing():
        capture = _capture_id(stream.cuda_stream)
        key = None if capture is None else ("graph", capture, stream.cuda_stream, items)
        if key is not None and key not in _counters:
            # entries of earlier captures are no longer used: their graphs zero their own
            for old in [k for k in _counters if k[0] == "graph" and k[1] != capture]:
                del _counters[old]
    elif mode == "reuse":
        key = ("eager", device.index, stream.cuda_stream, items)
    else:
        key = None
    if key is None:
        return torch.zeros(items, dtype=torch.int32, device=device)
    buf = _counters.get(key)
    if buf is None:
        buf = _counters[key] = torch.zeros(items, dtype=torch.int32, device=device)
    return buf


def _capture_id(stream: int) -> int | None:
    """The process-unique id of the CUDA-graph capture the stream ``stream`` (a handle) is in;
    None if it cannot be told (then :func:`streamk_counters` zeroes a buffer per call)."""
    try:
        from cuda.bindings import runtime as rt

        err, status, capture = rt.cudaStreamGetCaptureInfo(stream)[:3]
    except Exception:  # no cuda-python, or an API it does not have
        return None
    if (err != rt.cudaError_t.cudaSuccess
            or status != rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive):
        return None
    return int(capture)


def _tile_rows(tile_rows, tile_expert, block_m, dev):
    if tile_rows is not None:
        return tile_rows.contiguous()
    if tile_expert is None:
        return _dummy(torch.int32, dev)
    return torch.full_like(tile_expert, block_m)


def linear(x, weight, weight_scale, global_scale, bias, wfrag=False):
    """CUDA kernel of ``nvfp4::linear`` (arguments already validated by the op; ``wfrag``:
    ``weight`` prepared by ``nvfp4::to_wfrag_``, read with ``wfrag`` + ``wperm`` configs)."""
    num_tokens, k = x.shape
    n = weight.shape[0]
    if not supported(n, k):
        from nvfp4_ops.reference import linear_reference

        return linear_reference(x, weight, weight_scale, global_scale, bias, wfrag=wfrag)
    out = torch.empty((num_tokens, n), dtype=torch.bfloat16, device=x.device)
    if num_tokens == 0:
        return out
    # a view, no copy (an expand-copy per call cost 36.5 vs 34.8 us at M=1 (7168, 18432), H200)
    w_global = (per_group_global_view(global_scale, n) if global_scale.dim() == 0
                else per_row_global_view(global_scale, n))
    grouped_w4a16_gemm(
        x, None, weight.unsqueeze(0), weight_scale.unsqueeze(0), w_global, out,
        epilogue="none", bias=bias, block_m=block_m_for_tokens(num_tokens), wperm=wfrag,
        wfrag=wfrag,
    )
    return out


def mlp(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global, swiglu_limit, wfrag=False):
    """CUDA kernel of ``nvfp4::mlp``: SwiGLU fused into the gate/up GEMM's epilogue (``wfrag``:
    both weights prepared by ``nvfp4::to_wfrag_``)."""
    num_tokens, hidden = x.shape
    inter = w13.shape[0] // 2
    if not (supported(inter, hidden) and supported(hidden, inter) and inter % 16 == 0):
        from nvfp4_ops.reference import mlp_reference

        return mlp_reference(x, w13, w13_scale, w13_global, w2, w2_scale, w2_global,
                             swiglu_limit, wfrag=wfrag)
    out = torch.empty((num_tokens, hidden), dtype=torch.bfloat16, device=x.device)
    if num_tokens == 0:
        return out
    bm = block_m_for_tokens(num_tokens)
    act = torch.empty((num_tokens, inter), dtype=torch.bfloat16, device=x.device)
    grouped_w4a16_gemm(
        x, None, w13.unsqueeze(0), w13_scale.unsqueeze(0), gate_up_global_view(w13_global, inter),
        act,
        epilogue="swiglu", swiglu_limit=swiglu_limit, block_m=bm, wperm=wfrag, wfrag=wfrag,
    )
    w2_rows = (per_group_global_view(w2_global, hidden) if w2_global.dim() == 0
               else per_row_global_view(w2_global, hidden))
    grouped_w4a16_gemm(
        act, None, w2.unsqueeze(0), w2_scale.unsqueeze(0), w2_rows, out,
        epilogue="none", block_m=bm, wperm=wfrag, wfrag=wfrag,
    )
    return out


def variants_for_shapes(shapes: Iterable[str], *, include_moe: bool = True) -> list:
    """Every GEMM config the named model shapes can reach (shared-expert MLP, and the MoE's
    grouped gate/up (``swiglu``) and down (``row_scale``) GEMMs), for every token tile."""
    from nvfp4_ops.kernels.moe_cuda import wperm_supported as moe_wperm
    from nvfp4_ops.shapes import get_shape

    seen: dict[str, object] = {}
    for name in shapes:
        s = get_shape(name)
        for n, k, epi, grouped in s.gemm_problems(include_moe):
            n_out = n // 2 if epi == "swiglu" else n
            if not supported(n_out, k):
                continue
            for bm in BLOCK_MS:
                if grouped and not grouped_supported(n_out, k, bm):
                    continue
                # the MoE passes kperm exactly when both of its GEMMs run a family with a
                # permuted order (WGMMA, or the streamed 8-token tiles)
                kperm = grouped and grouped_kperm(s.hidden, s.intermediate, bm)
                # MoE weights may come in either bit order when its kernels read wperm; dense
                # weights in the checkpoint order or prepared by to_wfrag_ (wfrag + wperm)
                if grouped:
                    orders = ((False, False), (True, False)) if (
                        kperm and moe_wperm(s.hidden, s.intermediate)) else ((False, False),)
                else:
                    orders = ((False, False), (True, True))
                for m_tiles in reach_m_tiles(bm, grouped):
                    for wperm, wfrag in orders:
                        # the MoE launches its grouped GEMMs with pdl (moe_cuda)
                        cfg = choose_config(n, k, bm, epi, False, grouped, m_tiles, kperm,
                                            grouped, wperm, wfrag)
                        seen.setdefault(cfg.name, cfg)
    return list(seen.values())


@functools.cache
def reach_m_tiles(block_m: int, grouped: bool) -> tuple[int, ...]:
    """The ``m_tiles`` values a call with tile ``block_m`` can pass to :func:`choose_config`:
    :func:`dense_m_tiles`, or for grouped problems every value up to the grouped cap."""
    if grouped:
        return tuple(range(1, _m_tiles_cap(True) + 1))
    return dense_m_tiles(block_m)


@functools.cache
def dense_m_tiles(block_m: int) -> tuple[int, ...]:
    """The ``m_tiles`` values a dense linear with tile ``block_m`` can pass to
    :func:`choose_config` (from :func:`block_m_for_tokens` and :func:`_m_tiles_cap`)."""
    cap = _m_tiles_cap()
    reach = {min(-(-m // block_m), cap) for m in range(1, block_m * cap + 1)
             if block_m_for_tokens(m) == block_m}
    return tuple(sorted(reach))


@functools.cache
def _m_tiles_cap(grouped: bool = False) -> int:
    """Calls pass ``m_tiles`` clamped to where the choice stops changing, so the cached
    :func:`choose_config` has bounded keys: the WGMMA family's ``MAX_M_TILES`` (dense), one
    past the streamed family's ``PERSIST_MAX_TILES`` (grouped)."""
    if grouped:
        return _kernel_module(_STREAM).PERSIST_MAX_TILES + 1
    return _kernel_module(_WGMMA).MAX_M_TILES


def run_once(cfg, device: torch.device | str = "cuda") -> None:
    """Launch ``cfg`` once on small random data (warmup: loads the module onto the device)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = cfg.block_m + 1
    a = torch.randn(rows, cfg.k, generator=gen).to(torch.bfloat16).to(device)
    w = torch.randint(0, 256, (1, cfg.n, cfg.k // 2), generator=gen, dtype=torch.uint8).to(device)
    w_scale = torch.full((1, cfg.n, cfg.k // 16), 0x38, dtype=torch.uint8, device=device)
    # the shape every op passes for a per-tensor scale: a stride-0 view
    halves = _global_halves(cfg.epilogue)
    w_global = torch.ones((), dtype=torch.float32, device=device).expand(1, halves,
                                                                          cfg.n // halves)
    out = torch.empty(rows, cfg.n_out, dtype=torch.bfloat16, device=device)
    tiles = (rows + cfg.block_m - 1) // cfg.block_m
    tile_expert = torch.zeros(tiles, dtype=torch.int32, device=device) if cfg.grouped else None
    row_scale = torch.ones(rows, device=device) if cfg.epilogue == "row_scale" else None
    bias = torch.zeros(cfg.n, dtype=torch.bfloat16, device=device) if cfg.has_bias else None
    # this very config (the dispatch might pick another one for these rows)
    _launch(cfg, a, tile_expert, w, w_scale, w_global, out, 10.0, row_scale, bias)
