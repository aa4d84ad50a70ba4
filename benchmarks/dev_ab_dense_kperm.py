"""A/B helper (diagnostics, needs a GPU): dense linears (M >= 64, the WGMMA family) on
k-permuted activations (an experiment: not wired into ``nvfp4::linear``; branch ``dense-kperm``
wires it, and session 7's A/B, benchmarks/results/h200_2026-12-01_s7/ab/, kept it out).

Why: the MoE's WGMMA tiles read their activations in the 32-block ``kperm`` order
(:mod:`nvfp4_ops.kernels.kperm`), so each lane decodes its own 4 weight bytes with ``pair4``
instead of gathering bytes from 16 (session 3: ~13 % fewer SASS instructions per tile, MoE
T = 4096 GEMMs -11 %). A dense linear gets natural-order activations from its caller, so it
would have to permute ``x`` first (one extra pass over ``x``). With ``kperm`` the weights can
also be in the ``wperm`` bit order (:mod:`nvfp4_ops.kernels.wperm`). Dense M = 128 is 0.92x /
0.69x of bf16 (target > 1).

Cases: (7168, 18432) and (18432, 7168) at ``--ms``, the dispatch's tile and config
(``linear_cuda.choose_config``), three variants: ``natural`` (what ships), ``kperm`` (the same
config with ``kperm=True``; at M = 16 / 32, where ``mma.sync`` ships, the WGMMA tile of that
size with ``kperm``, one row warpgroup and 4 stages as the MoE's small tiles) on ``x`` permuted
as ``kperm.permute_k`` does), ``kperm+wperm`` (also ``wperm=True`` on ``wperm.to_wperm(w)``);
plus the permute itself (``index_select`` with a prebuilt index, a torch gather: an upper bound
for a fused or Triton permute). Checks first: ``kperm`` within fp32-order noise of ``natural``
(max abs diff <= 2e-2 x max |natural|: only the k summation order differs), ``kperm+wperm``
bitwise equal to ``kperm``. Timing: CUDA graphs, L2 flushed before every replay, variants
alternating for ``--rounds`` rounds; median µs; bf16 ``torch.matmul`` in the same rounds.

Usage: ``python benchmarks/dev_ab_dense_kperm.py [--ms 16 32 64 128 256 1024 8192] [--reps 20]
[--rounds 3] [--out FILE.json]``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _ab  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = _ab.parser(__doc__, tokens=[], reps=20)
    parser.add_argument("--ms", nargs="+", type=int, default=[16, 32, 64, 128, 256, 1024, 8192])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from nvfp4_ops.kernels import linear_cuda as L
    from nvfp4_ops.kernels.cute import w4a16_wgmma as W
    from nvfp4_ops.kernels.kperm import KPERM, _index
    from nvfp4_ops.kernels.wperm import to_wperm

    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    cases: dict[str, dict] = {}
    for n, k in ((7168, 18432), (18432, 7168)):
        torch.manual_seed(n)
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        w_p = to_wperm(w)
        ws = (torch.rand(n, k // 16, device="cuda") + 0.25).to(torch.float8_e4m3fn)
        wg = torch.rand(n, device="cuda") * 0.02 + 0.005
        gv = L.per_row_global_view(wg, n)
        w_bf16 = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        # built outside the graphs (kperm.permute_k builds it per call from a host list)
        idx = _index(k, KPERM, "cuda")
        for m in args.ms:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            xp = x.index_select(1, idx)
            bm = L.block_m_for_tokens(m)
            base = L.linear_config(n, k, m)
            if L.config_family(base) == "w4a16_wgmma":
                kp = dataclasses.replace(base, kperm=True)
            elif bm in (16, 32):
                # mma.sync ships here; the WGMMA tile of the same size on permuted x instead,
                # shaped as the MoE's small tiles (one row warpgroup, 4 stages: 2x the CTAs)
                kp = W.WgmmaConfig(n, k, "none", False, False, bm, 1, 1, 4, kperm=True)
            else:
                print(f"{n}x{k} M={m}: {base.name} (streamed tile); skipped")
                continue
            kpw = dataclasses.replace(kp, wperm=True)
            outs = {v: torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                    for v in ("natural", "kperm", "kperm+wperm")}

            def run(cfg, a, wt, out, gv=gv, ws=ws):
                return lambda: L._launch(cfg, a, None, wt[None], ws[None], gv, out, None, None,
                                         None)
            variants = {"natural": run(base, x, w, outs["natural"]),
                        "kperm": run(kp, xp, w, outs["kperm"]),
                        "kperm+wperm": run(kpw, xp, w_p, outs["kperm+wperm"]),
                        "permute_k(x)": lambda x=x, idx=idx: x.index_select(1, idx),
                        "bf16 matmul": lambda x=x, w_bf16=w_bf16: x @ w_bf16.t()}
            label = f"{n}x{k} M={m} ({base.name.split('_', 1)[1][:28]} | {kp.name[8:]})"
            for v, out in outs.items():
                out.fill_(float("nan"))
                variants[v]()
            ref = outs["natural"].float()
            diff = (outs["kperm"].float() - ref).abs().max().item()
            if not (torch.isfinite(outs["kperm"]).all() and diff <= 2e-2 * ref.abs().max().item()
                    and torch.equal(outs["kperm"], outs["kperm+wperm"])):
                print(f"{label}: CHECK FAILED (kperm vs natural max abs diff {diff:.3e}; "
                      f"kperm+wperm bitwise equal to kperm: "
                      f"{torch.equal(outs['kperm'], outs['kperm+wperm'])})")
                return 1
            print(f"{label}: checked (kperm vs natural max abs diff {diff:.2e}; kperm+wperm "
                  "bitwise = kperm)", flush=True)
            cases[label] = variants
    med = _ab.alternate_cases(cases, args.rounds, args.reps, flush)
    print(f"{'case':64s} {'natural':>8s} {'kperm':>8s} {'+wperm':>8s} {'permute':>8s} "
          f"{'bf16':>8s} {'best+perm vs nat':>16s}")
    for label, d in med.items():
        best = min(d["kperm"], d["kperm+wperm"]) + d["permute_k(x)"]
        print(f"{label:64s} {d['natural']:8.1f} {d['kperm']:8.1f} {d['kperm+wperm']:8.1f} "
              f"{d['permute_k(x)']:8.1f} {d['bf16 matmul']:8.1f} {best / d['natural']:16.3f}")
    if args.out:
        args.out.write_text(json.dumps(med, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
