"""Static SASS counts of the dispatched GEMM kernels (diagnostics; CPU only, no GPU needed).

For each ``--nk`` shape and token count ``--ms``, the config ``nvfp4::linear`` would launch on
prepared weights (``dispatch.plan_linear(..., order=WeightOrder.WFRAG)``; ``--checkpoint``
for the checkpoint order) is compiled for sm_90a with its PTX kept, assembled with ptxas and
disassembled with nvdisasm. Printed per kernel: its registers per thread, its instruction
count and, for its steady-state k loop (of the loops that issue MMAs, a label and a backward
branch, the one with the fewest instructions per MMA), its length, its MMAs, instructions per
MMA and a breakdown: integer decode work, ``HMUL2`` (the block-scale
multiply), block-scale conversion (``F2FP``, ``HADD2.F32``, ``FMUL``), loads, uniform-datapath
and synchronisation.

Why: the decode kernels are limited by the instructions their consumer warps issue per weight
byte (``nvfp4_ops/kernels/DESIGN.md``, "What limits decode"), and these counts move with every
decoder change while a GPU is not at hand. They are static counts: a loop's length, not
cycles.

``--moe SHAPE`` (``v4-flash``, ...): the MoE's two grouped GEMMs (gate/up ``swiglu``, down
``row_scale``) at every token tile instead, as ``nvfp4::moe`` launches them (permuted
activations where both GEMMs have them, ``wperm`` weights where its kernels read them, launch
overlap, the grouped ``m_tiles`` cap).

``--mx`` (with ``--moe``): each GEMM's MXFP4 variant (UE8M0 scales, ``mx``) after it.

``--variants SHAPE ...``: every GEMM config ``nvfp4_ops.warmup`` reaches for those model
shapes (dense MLP and the MoE's grouped GEMMs, every token tile and weight order).

``--ptx-hash``: print ``sha256 config-name`` of each case's PTX instead of the SASS counts
(no ptxas needed). Run it on two trees and ``diff`` the outputs to show that a refactor changes
no generated code.

Usage: ``python benchmarks/dev/sass.py [--nk 7168x18432 18432x7168] [--ms 1 16 128]
[--checkpoint] [--moe SHAPE | --variants SHAPE ...] [--fields FIELD=V[,..]] [--ptx-hash]
[--keep DIR]``; ``--fields`` adds each case whose config has those fields with them set, right
after it. The SASS counts need ptxas 13 (the ``nvidia-cuda-nvcc`` wheel the ``vllm`` extra brings;
triton's ptxas 12.9 rejects CuTeDSL 4.8's PTX 9.4) and nvdisasm (triton's), found by
:func:`nvfp4_ops.testing.find_cuda_tool`.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_INSTR = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);", re.M)
_LABEL = re.compile(r"^(\.L_x_\d+):", re.M)

#: breakdown classes, by opcode prefix (first match wins)
CLASSES = (
    ("mma", ("HMMA", "HGMMA")),
    ("scale cvt", ("F2FP", "HADD2.F32", "FMUL")),
    ("hmul2", ("HMUL2",)),
    ("int decode", ("LOP3", "SHF", "IMAD.SHL", "PRMT", "IADD3", "LEA", "IMAD")),
    ("loads", ("LDS", "LDG", "LDSM")),
    ("uniform", ("U", "R2UR", "VOTEU")),
    ("sync", ("SYNCS", "BAR", "WARPGROUP", "WARPSYNC", "MEMBAR", "FENCE", "DEPBAR")),
)


def tool(name: str) -> str:
    """Path of ``ptxas`` / ``nvdisasm`` (:func:`nvfp4_ops.testing.find_cuda_tool`); exits with
    its message when the tool is missing."""
    from nvfp4_ops.testing import find_cuda_tool

    try:
        return find_cuda_tool(name)
    except FileNotFoundError as exc:
        raise SystemExit(f"sass: {exc}") from None


def sass_of(cfg, folder: Path) -> str:
    """Compile ``cfg`` (PTX kept in ``folder``), assemble for sm_90a, return its SASS text
    (ptxas's resource report in ``folder / "ptxas.txt"``, read by :func:`registers`)."""
    from nvfp4_ops.testing import kernel_ptx

    kernel_ptx(cfg, folder)
    (ptx,) = folder.glob("*.ptx")
    cubin = folder / "kernel.cubin"
    info = subprocess.run([tool("ptxas"), "-arch=sm_90a", "-v", "-o", str(cubin), str(ptx)],
                          check=True, capture_output=True, text=True)
    (folder / "ptxas.txt").write_text(info.stdout + info.stderr)
    sass = subprocess.run([tool("nvdisasm"), "-c", str(cubin)], check=True,
                          capture_output=True, text=True).stdout
    (folder / "kernel.sass").write_text(sass)
    return sass


def registers(folder: Path) -> int:
    """Registers per thread of the kernel :func:`sass_of` assembled in ``folder``."""
    m = re.search(r"Used (\d+) registers", (folder / "ptxas.txt").read_text())
    return int(m.group(1)) if m else -1


def classify(op: str) -> str:
    for name, prefixes in CLASSES:
        if op.startswith(prefixes):
            return name
    return "other"


def loops(sass: str) -> list[dict]:
    """Loops that issue MMAs (label .. backward branch), fewest instructions per MMA first:
    the steady-state k loop (an unrolled one included) before the loops around it and the
    barrier-wait retries that jump back over an MMA."""
    events = []  # (position, kind, payload)
    for m in _LABEL.finditer(sass):
        events.append((m.start(), "label", m.group(1)))
    for m in _INSTR.finditer(sass):
        events.append((m.start(), "op", (m.group(1), m.group(2))))
    events.sort()
    ops, label_at = [], {}
    for _, kind, payload in events:
        if kind == "label":
            label_at[payload] = len(ops)
        else:
            ops.append(payload)
    found = []
    for i, (op, args) in enumerate(ops):
        target = re.search(r"`\((\.L_x_\d+)\)", args) if op.startswith("BRA") else None
        if target and label_at.get(target.group(1), i + 1) <= i:
            body = [o for o, _ in ops[label_at[target.group(1)]:i + 1]]
            mma = sum(classify(o) == "mma" for o in body)
            if mma:
                found.append({"len": len(body), "mma": mma,
                              "classes": collections.Counter(classify(o) for o in body)})
    return sorted(found, key=lambda lp: (lp["len"] / lp["mma"], lp["len"]))


def dense_cases(nks: list[str], ms: list[int], prepared: bool) -> list[tuple[str, object]]:
    """``(label, config)`` of ``nvfp4::linear`` at each shape ``NxK`` and token count."""
    from nvfp4_ops.kernels.dispatch import WeightOrder, plan_linear

    order = WeightOrder.WFRAG if prepared else WeightOrder.CHECKPOINT
    out = []
    for nk in nks:
        n, k = (int(v) for v in nk.split("x"))
        out += [(f"{n}x{k} M={m}", plan_linear(n, k, m, order=order).config) for m in ms]
    return out


def moe_cases(shape_name: str, mx: bool = False) -> list[tuple[str, object]]:
    """``(label, config)`` of the MoE's gate/up and down GEMMs at every token tile (``mx``:
    their MXFP4 variants, UE8M0 scales read natively)."""
    from nvfp4_ops import get_shape
    from nvfp4_ops.kernels import dispatch as D

    s = get_shape(shape_name)
    h, i = s.hidden, s.intermediate
    order = D.WeightOrder.WPERM if D.moe_wperm_supported(h, i) else D.WeightOrder.CHECKPOINT
    out = []
    for bm in D.BLOCK_MS:
        # a token count that lands on this tile (the mean rows per expert), with many tiles
        tokens = max(1, bm * s.experts // s.top_k)
        plan = D.plan_moe(tokens, s.top_k, s.experts, h, i, order=order, block_m=bm, mx=mx)
        tag = " mx" if mx else ""
        out += [(f"{shape_name}{tag} gate/up tile {bm}", plan.gate_up.config),
                (f"{shape_name}{tag} down tile {bm}", plan.down.config)]
    return out


def variant_cases(shapes: list[str]) -> list[tuple[str, object]]:
    """``(label, config)`` of every config the warmup of these model shapes reaches."""
    from nvfp4_ops import _warmup

    plans = _warmup.plans_for(_warmup.layers_for_shapes(shapes))
    return [(f"{'+'.join(shapes)} variant", p.config) for p in plans]


def ptx_hash(cfg, folder: Path) -> str:
    """sha256 of ``cfg``'s PTX (compiled for sm_90a, kept in ``folder``)."""
    import hashlib

    from nvfp4_ops.testing import kernel_ptx

    return hashlib.sha256(kernel_ptx(cfg, folder).encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nk", nargs="+", default=["7168x18432", "18432x7168"])
    p.add_argument("--ms", nargs="+", type=int, default=[1, 16, 128])
    p.add_argument("--checkpoint", action="store_true",
                   help="the checkpoint weight order instead of prepared (wfrag + wperm)")
    p.add_argument("--moe", metavar="SHAPE",
                   help="the MoE GEMMs of this model shape at every token tile, not dense ones")
    p.add_argument("--mx", action="store_true",
                   help="with --moe: the MXFP4 variants (UE8M0 scales) next to the NVFP4 ones")
    p.add_argument("--variants", nargs="+", metavar="SHAPE",
                   help="every config nvfp4_ops.warmup reaches for these model shapes")
    p.add_argument("--fields", metavar="FIELD=V[,FIELD=V]",
                   help="also count each case whose config has these fields with them set (int "
                        "values), right after it, e.g. unroll=1")
    p.add_argument("--ptx-hash", action="store_true",
                   help="print the sha256 of each case's PTX instead of SASS counts")
    p.add_argument("--keep", type=Path, help="keep PTX / cubin / SASS under this folder")
    args = p.parse_args(argv)
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    root = args.keep or Path(tempfile.mkdtemp(prefix="nvfp4_sass_"))
    prepared = not args.checkpoint
    if args.variants:
        cases = variant_cases(args.variants)
    elif args.moe:
        cases = moe_cases(args.moe)
        if args.mx:  # each MXFP4 case right after its NVFP4 twin
            cases = [c for pair in zip(cases, moe_cases(args.moe, mx=True), strict=True)
                     for c in pair]
    else:
        cases = dense_cases(args.nk, args.ms, prepared)
    if args.fields:
        import dataclasses

        fields = {k: int(v) for k, v in (kv.split("=", 1) for kv in args.fields.split(","))}
        tag = ",".join(f"{k}={v}" for k, v in fields.items())

        def varied(cfg):  # the fields in the config's own types (a bool stays a bool)
            return dataclasses.replace(cfg, **{k: type(getattr(cfg, k))(v)
                                               for k, v in fields.items()})

        cases = [c for label, cfg in cases for c in (
            [(label, cfg), (f"{label} +{tag}", varied(cfg))]
            if all(hasattr(cfg, k) for k in fields) else [(label, cfg)])]
    if args.ptx_hash:
        for _, cfg in cases:
            folder = root / cfg.name
            shutil.rmtree(folder, ignore_errors=True)
            print(f"{ptx_hash(cfg, folder)}  {cfg.name}", flush=True)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        return 0
    names = [name for name, _ in CLASSES] + ["other"]
    print(f"{'case':44s} {'regs':>4s} {'kernel':>6s} {'loop':>5s} {'mma':>4s} {'/mma':>6s}  "
          + " ".join(f"{n[:10]:>10s}" for n in names), flush=True)
    for label, cfg in cases:
        folder = root / cfg.name
        shutil.rmtree(folder, ignore_errors=True)
        sass = sass_of(cfg, folder)
        total = len(_INSTR.findall(sass))
        label = f"{label} {cfg.name.split('_', 1)[0]}"
        found = loops(sass)
        regs = registers(folder)
        if not found:
            print(f"{label:44s} {regs:4d} {total:6d}  (no MMA loop)")
            continue
        lp = found[0]
        cells = " ".join(f"{lp['classes'].get(c, 0):10d}" for c in names)
        print(f"{label:44s} {regs:4d} {total:6d} {lp['len']:5d} {lp['mma']:4d} "
              f"{lp['len'] / lp['mma']:6.1f}  {cells}", flush=True)
    if args.keep:
        print(f"PTX / cubin / SASS under {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
