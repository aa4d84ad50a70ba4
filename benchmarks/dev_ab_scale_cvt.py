"""A/B helper (diagnostics, needs a GPU): the block-scale conversion of the dense kernels,
``pack`` (this tree's :func:`nvfp4_ops.kernels.cute.fp4_ptx._scales_ptx`: both scales packed
into one bf16x2 and prescaled by one ``mul.rn.bf16x2``, the halves picked by ``HMUL2`` operand
swizzles; 5 SASS instructions per two scales) against ``dup`` (the previous PTX, kept below:
each scale prescaled in fp32 and packed twice; 7 per two).

Why: the decoders spend most of their instructions per weight byte, and the streamed M = 1
kernel is issue-limited (CONTRIBUTING, measured facts). sm_90a SASS, CPU: the streamed
M = 1 loop at (7168, 18432) 328 -> 318 instructions, the 16-token WGMMA stream-K tile 1304 ->
1280, the ``mma.sync`` 16-token tile 1280 -> 1256.

Cases: ``--nk`` shapes at ``--ms``, the dispatch's config on prepared (wfrag + wperm) weights,
both conversions compiled from the same source (``dup`` by patching ``fp4_ptx`` in spawned
compile workers that write to their own cache folder). Checks first, on NaN-poisoned
outputs: the two bitwise equal (the decoded bf16 weights are identical). The block scales
include every e4m3 byte but the two NaNs (negative, zero and subnormal ones too). Timing:
CUDA graphs, L2 evicted before every replay (``--flush``), variants alternating for
``--rounds`` rounds; median µs, with bf16 ``torch.matmul``.

Usage: ``python benchmarks/dev_ab_scale_cvt.py [--ms 1 16 32 128] [--nk 7168x18432 18432x7168]
[--reps 20] [--rounds 3] [--flush read|write] [--jobs 8] [--out FILE.json]``.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _ab  # noqa: E402


def _scales_ptx_dup(prescale: str) -> str:
    """The conversion before ``pack`` (``prescale`` given as the fp32 hex literal it used)."""
    prescale = "0f7B000000" if prescale else ""
    mul = (f"mul.f32 f0, f0, {prescale};\n" f"mul.f32 f1, f1, {prescale};\n") if prescale else ""
    return ("{\n.reg .b16 s16, h0, h1;\n.reg .b32 hh;\n.reg .f32 f0, f1;\n"
            "cvt.u16.u32 s16, {$r0};\ncvt.rn.f16x2.e4m3x2 hh, s16;\nmov.b32 {h0, h1}, hh;\n"
            "cvt.f32.f16 f0, h0;\ncvt.f32.f16 f1, h1;\n" + mul
            + "cvt.rn.bf16x2.f32 {$w0}, f0, f0;\ncvt.rn.bf16x2.f32 {$w1}, f1, f1;\n}")


def _use_dup(cache: str) -> None:
    """Worker initializer: compile ``dup`` into its own cache folder."""
    os.environ["NVFP4_OPS_CACHE_DIR"] = cache
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from nvfp4_ops.kernels.cute import fp4_ptx

    fp4_ptx._scales_ptx = _scales_ptx_dup


def _compile_dup(cfg) -> str:
    from nvfp4_ops.cli.precompile import _compile_only

    return _compile_only(cfg)[0]


def _load(cfgs, cache: str | None) -> dict:
    """Binaries of ``cfgs`` from the disk cache at ``cache`` (None: the default one)."""
    from nvfp4_ops import _compile
    from nvfp4_ops.kernels import linear_cuda as L

    old = os.environ.get("NVFP4_OPS_CACHE_DIR")
    _compile.clear_memory_cache()
    try:
        if cache is not None:
            os.environ["NVFP4_OPS_CACHE_DIR"] = cache
        with _compile.no_compile():
            return {cfg: L.compiled_gemm(cfg) for cfg in cfgs}
    finally:
        if old is None:
            os.environ.pop("NVFP4_OPS_CACHE_DIR", None)
        else:
            os.environ["NVFP4_OPS_CACHE_DIR"] = old
        _compile.clear_memory_cache()


def every_scale_byte(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """e4m3 block scales ``[n, k/16]`` cycling through every byte but the NaNs (0x7F, 0xFF),
    shuffled."""
    codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    idx = torch.randint(0, codes.numel(), (n, k // 16), generator=gen)
    return codes[idx].view(torch.float8_e4m3fn)


def main(argv: list[str] | None = None) -> int:
    parser = _ab.parser(__doc__, tokens=[], reps=20)
    parser.add_argument("--ms", nargs="+", type=int, default=[1, 16, 32, 128])
    parser.add_argument("--nk", nargs="+", default=["7168x18432", "18432x7168"])
    parser.add_argument("--flush", choices=("write", "read"), default="read")
    parser.add_argument("--jobs", type=int, default=8)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import bench_moe

    from nvfp4_ops.cli.precompile import compile_configs
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels.wfrag import to_wfrag
    from nvfp4_ops.kernels.wperm import to_wperm

    shapes = [tuple(int(v) for v in nk.split("x")) for nk in args.nk]

    def config(n: int, k: int, m: int):
        bm = L.block_m_for_tokens(m)
        return L.choose_config(n, k, bm, "none", False, False,
                               min(-(-m // bm), L._m_tiles_cap()), wperm=True, wfrag=True)

    cfgs = list(dict.fromkeys(config(n, k, m) for n, k in shapes for m in args.ms))
    compile_configs(cfgs, args.jobs, "pack")
    dup_cache = tempfile.mkdtemp(prefix="nvfp4_dup_")
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx, initializer=_use_dup,
                                                initargs=(dup_cache,)) as pool:
        for i, name in enumerate(pool.map(_compile_dup, cfgs)):
            print(f"[{i + 1}/{len(cfgs)}] {name} (dup)", flush=True)
    binaries = {"pack": _load(cfgs, None), "dup": _load(cfgs, dup_cache)}
    real = L.compiled_gemm

    def launcher(variant, cfg, x, w, ws, gv, out):
        def run():
            L.compiled_gemm = binaries[variant].__getitem__
            try:
                L._launch(cfg, x, None, w, ws, gv, out, None, None, None)
            finally:
                L.compiled_gemm = real
        return run

    flush = bench_moe.l2_flush(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"),
                               args.flush)
    cases: dict[str, dict] = {}
    for n, k in shapes:
        gen = torch.Generator().manual_seed(n)
        w = to_wperm(to_wfrag(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8,
                                            generator=gen))).cuda()[None]
        ws = every_scale_byte(n, k, gen).cuda()[None]
        gv = L.per_row_global_view(torch.rand(n, generator=gen).cuda() * 0.02 + 0.005, n)
        w_bf16 = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        for m in args.ms:
            cfg = config(n, k, m)
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            outs = {v: torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                    for v in binaries}
            runs = {v: launcher(v, cfg, x, w, ws, gv, outs[v]) for v in binaries}
            for run in runs.values():
                run()
            label = f"{n}x{k} M={m} ({cfg.name.split('_', 1)[1][:40]})"
            if not torch.equal(outs["pack"], outs["dup"]) or outs["pack"].isnan().any():
                print(f"{label}: CHECK FAILED (pack and dup differ, or NaN in the output)")
                return 1
            print(f"{label}: bitwise equal", flush=True)
            runs["bf16 matmul"] = lambda x=x, w_bf16=w_bf16: x @ w_bf16.t()
            cases[label] = runs
    med = _ab.alternate_cases(cases, args.rounds, args.reps, flush)
    print(f"{'case':62s} {'pack':>8s} {'dup':>8s} {'dup/pack':>9s} {'bf16/pack':>10s}")
    for label, d in med.items():
        print(f"{label:62s} {d['pack']:8.2f} {d['dup']:8.2f} {d['dup'] / d['pack']:9.3f} "
              f"{d['bf16 matmul'] / d['pack']:10.3f}")
    if args.out:
        args.out.write_text(json.dumps(med, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
