"""Dev probe (session 4): (a) does a tvm-ffi compiled CuTeDSL kernel accept stride-0 (expanded)
fp32 views for a dynamic-stride tensor argument; (b) how the streamed decode kernel's M=1 time
scales with the number of CTAs per SM (is SM load balance the limit?); (c) what the per-call
global-scale expansion in ``linear`` costs (op vs the bare GEMM with a prebuilt [1, N] row).

Usage (device): ``python3 benchmarks/dev_balance.py``. Prints a table; timing by CUDA-graph
replay with weight copies rotated (cold L2), medians.
"""

from __future__ import annotations

import functools
import os
import sys

os.environ.setdefault("NVFP4_OPS_CACHE_DIR", "/tmp/nvfp4_cache")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import torch  # noqa: E402
from _timing import capture, replay_median_us  # noqa: E402
from cutlass import Float32  # noqa: E402

_PROBE_N = 256


class _Stride0Probe:
    """out[e, h * n/2 + t] = 2 * g[e, h, t] with ``g`` of dynamic strides."""

    @cute.kernel
    def kernel(self, g: cute.Tensor, out: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        e, _, _ = cute.arch.block_idx()
        for h in cutlass.range_constexpr(2):
            out[e, h * (_PROBE_N // 2) + tid] = g[e, h, tid] * Float32(2.0)

    @cute.jit
    def __call__(self, g: cute.Tensor, out: cute.Tensor, stream):
        self.kernel(g, out).launch(grid=[g.shape[0], 1, 1], block=[_PROBE_N // 2, 1, 1],
                                   stream=stream)


def probe_stride0() -> str:
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_tensor
    from cutlass.runtime import make_fake_stream

    n = _PROBE_N
    K = _Stride0Probe
    sym = cute.sym_int
    g = make_fake_tensor(Float32, (sym(), 2, n // 2), (sym(), sym(), sym()))
    out = make_fake_compact_tensor(Float32, (sym(), n), stride_order=(1, 0))
    fn = cute.compile(K(), g, out, make_fake_stream(use_tvm_ffi_env_stream=True),
                      options="--gpu-arch sm_90a --enable-tvm-ffi")
    res = []
    e = 5
    base = torch.rand(e, 2, device="cuda") + 0.5
    cases = {
        "pair stride (2,1,0)": base.reshape(e, 2, 1).expand(e, 2, n // 2),
        "scalar stride (0,0,0)": base[0, 0].reshape(1, 1, 1).expand(e, 2, n // 2),
        "per-row contiguous": torch.rand(e, 2, n // 2, device="cuda"),
        "per-row [G,N] view": torch.rand(e, n, device="cuda").view(e, 2, n // 2),
    }
    for name, gv in cases.items():
        o = torch.full((e, n), float("nan"), device="cuda")
        try:
            fn(gv, o)
            torch.cuda.synchronize()
            ok = torch.equal(o, (gv * 2).reshape(e, n))
            res.append(f"stride0 probe {name} strides {tuple(gv.stride())}: "
                       f"{'EXACT' if ok else 'WRONG'}")
        except Exception as exc:  # report, do not stop the other probes
            res.append(f"stride0 probe {name}: raised {type(exc).__name__}: {exc}")
    return "\n".join(res)


def time_stream_m1(rows):
    from nvfp4_ops.kernels import linear_cuda as L

    out = []
    for n, k in rows:
        cfg = L.choose_config(n, k, 8, "none", False, False, None)
        copies = 3
        ws = [torch.randint(0, 256, (1, n, k // 2), dtype=torch.uint8, device="cuda")
              for _ in range(copies)]
        ss = [torch.randint(0x20, 0x48, (1, n, k // 16), dtype=torch.uint8, device="cuda")
              for _ in range(copies)]
        g = torch.rand(1, n, device="cuda") + 0.5
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        y = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
        fn = L.compiled_gemm(cfg)
        calls = []
        for i in range(copies * 4):
            w, s = ws[i % copies], ss[i % copies]
            calls.append(functools.partial(L._launch, cfg, x, None, w, s, g, y, None, None,
                                           None))
        for c in calls[:copies]:
            c()
        torch.cuda.synchronize()
        graph = capture(calls)
        us = replay_median_us(graph, 20, len(calls))
        ctas = n // cfg.rows_out
        out.append((n, k, ctas, ctas / 132, us, us / (n * k) * 1e8, fn is not None))
    return out


def time_linear_op_vs_bare(n, k):
    import nvfp4_ops
    from nvfp4_ops.kernels import linear_cuda as L

    copies = 3
    ws = [torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
          for _ in range(copies)]
    ss = [torch.randint(0x20, 0x48, (n, k // 16), dtype=torch.uint8, device="cuda")
          .view(torch.float8_e4m3fn) for _ in range(copies)]
    gs = torch.tensor(0.75, device="cuda")
    row = gs.reshape(1, 1).expand(1, n).contiguous()
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    y = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    cfg = L.choose_config(n, k, 8, "none", False, False, None)
    res = {}
    for name, mk in {
        "op": lambda w, s: (lambda: nvfp4_ops.linear(x, w, s, gs)),
        "bare": lambda w, s: (lambda: L._launch(cfg, x, None, w.unsqueeze(0), s.unsqueeze(0),
                                                row, y, None, None, None)),
    }.items():
        calls = [mk(ws[i % copies], ss[i % copies]) for i in range(copies * 4)]
        for c in calls[:copies]:
            c()
        torch.cuda.synchronize()
        graph = capture(calls)
        res[name] = replay_median_us(graph, 20, len(calls))
    return res


def main() -> None:
    print("gpu", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    print(probe_stride0(), flush=True)
    print(f"{'N':>6} {'K':>6} {'CTAs':>5} {'/SM':>5} {'us':>8} {'us/1e8 w':>9}")
    for r in time_stream_m1([(4224, 18432), (6336, 18432), (7168, 18432), (8448, 18432),
                             (15840, 7168), (16896, 7168), (18432, 7168), (19008, 7168)]):
        print(f"{r[0]:6d} {r[1]:6d} {r[2]:5d} {r[3]:5.2f} {r[4]:8.2f} {r[5]:9.3f}", flush=True)
    for n, k in [(7168, 18432), (18432, 7168)]:
        r = time_linear_op_vs_bare(n, k)
        print(f"linear M=1 ({n},{k}): op {r['op']:.2f} us, bare GEMM {r['bare']:.2f} us",
              flush=True)


if __name__ == "__main__":
    main()
