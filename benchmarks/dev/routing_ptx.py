"""What the MoE's one-CTA routing kernels compile to, without a GPU: per kernel and warp count,
the CTA barriers, shuffles, shared-memory accesses, atomics and global accesses in its PTX
for sm_90 (Triton compiles ahead without a device).

The one-CTA kernel (``_fused_routing_kernel``) runs four phases through global memory with
barriers between them; the direct kernel (``_direct_routing_kernel``, ``DIRECT_ROUTING``) is
built to need none of them: this shows whether the compiler kept it so. ::

    python benchmarks/dev/routing_ptx.py [--warps 8 4 2 1]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from nvfp4_ops.kernels.triton import moe_routing as mr  # noqa: E402

COUNTED = ("bar.sync", "shfl", "st.shared", "ld.shared", "atom.", "ld.global", "st.global")


def ptx_counts(kernel, constexprs: dict, warps: int) -> dict:
    """Occurrences of :data:`COUNTED` in ``kernel``'s PTX (int32 pointers and ints)."""
    signature = {name: "constexpr" if name in constexprs
                 else "*i32" if name.endswith("_ptr") else "i32" for name in kernel.arg_names}
    src = ASTSource(fn=kernel, signature=signature,
                    constexprs={(kernel.arg_names.index(n),): v for n, v in constexprs.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": warps}).asm["ptx"]
    return {name: ptx.count(name) for name in COUNTED}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--warps", nargs="+", type=int, default=[8, 4, 2, 1])
    args = p.parse_args(argv)
    kernels = {
        "one-CTA": (mr._fused_routing_kernel,
                    {"E_PAD": mr.MAX_EXPERTS, "BLOCK_M": 8, "BLOCK_M_HOT": 8,
                     "FILL_BLOCK": 1024, "BLOCK": 1024, "PDL": True}),
        "direct": (mr._direct_routing_kernel,
                   {"SLOTS": mr.DIRECT_MAX_SLOTS, "E_PAD": mr.MAX_EXPERTS, "BLOCK_M": 8,
                    "FILL_BLOCK": 64, "PDL": True}),
    }
    print(f"# triton {triton.__version__}, sm_90, block_m 8, {mr.MAX_EXPERTS} expert lanes")
    print(f"{'kernel':>8s} {'warps':>5s} " + " ".join(f"{c:>10s}" for c in COUNTED))
    for name, (kernel, constexprs) in kernels.items():
        for warps in args.warps:
            counts = ptx_counts(kernel, constexprs, warps)
            print(f"{name:>8s} {warps:5d} " + " ".join(f"{counts[c]:10d}" for c in COUNTED))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
