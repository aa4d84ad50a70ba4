"""Host µs of an op call's Python path before its kernels run, first call against repeat
(a diagnostic; no GPU needed).

Runs the ops' CUDA registrations on CPU tensors with the GPU check passed and the CuTeDSL
binaries replaced by a no-op, so what is timed is the Python an eager call pays besides the
launches themselves: for ``linear`` (7168, 18432) M = 1 and ``mlp`` (V4-Flash shared expert)
what every call did before launches were kept (checks, GPU check, kernel lookup, plan and
weight views, then the launch) against the registration call that repeats a kept launch
(:class:`nvfp4_ops.ops._eager.Repeats`);
for ``moe`` (V4-Flash, T = 1) only what comes before the first launch (checks, GPU check,
kernel lookup and :func:`~nvfp4_ops.kernels.moe_cuda.moe_launch`, against the repeat's
lookup, and of that the six weights' signature against reading their metadata alone), since
its Triton kernels would run in the interpreter on a CPU; and a tvm-ffi call
with a GEMM launch's twelve operands as torch tensors or as tvm-ffi tensors made once (what
the binary's argument passing costs, ``testing.nop``). Best of seven
rounds of ``--calls`` calls each; the host's speed is printed with them (200 dict lookups),
so figures from different hosts can be compared (the H200 machine's host took 4.8 µs for it,
``benchmarks/results/launch_cost_h200.log``).

    python benchmarks/dev/host_path_cpu.py [--calls 5000]
"""

from __future__ import annotations

import argparse
import importlib
import time

import torch


def _best_us(fn, calls: int, rounds: int = 7) -> float:
    for _ in range(min(calls, 200)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / calls / 1e3)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=5000)
    args = p.parse_args(argv)

    import nvfp4_ops
    from nvfp4_ops import _device, kernels
    from nvfp4_ops.kernels import linear_cuda
    from nvfp4_ops.testing import fast_random_experts, random_routing

    ops = {name: importlib.import_module(f"nvfp4_ops.ops.{name}")
           for name in ("linear", "mlp", "moe")}
    _device._supported[None] = True  # CPU tensors' device has no index
    linear_cuda.compiled = lambda config: (lambda *operands: None)

    n, k = 7168, 18432
    x = torch.zeros(1, k, dtype=torch.bfloat16)
    w = torch.zeros(n, k // 2, dtype=torch.uint8)
    ws = torch.zeros(n, k // 16, dtype=torch.uint8).view(torch.float8_e4m3fn)
    wg = torch.ones(())
    shape = nvfp4_ops.get_shape("v4-flash")
    hidden, inter = shape.hidden, shape.intermediate
    xm = torch.zeros(1, hidden, dtype=torch.bfloat16)
    w13 = torch.zeros(2 * inter, hidden // 2, dtype=torch.uint8)
    s13 = torch.zeros(2 * inter, hidden // 16, dtype=torch.uint8)
    w2 = torch.zeros(hidden, inter // 2, dtype=torch.uint8)
    s2 = torch.zeros(hidden, inter // 16, dtype=torch.uint8)
    g13, g2 = torch.ones(2), torch.ones(())
    experts = fast_random_experts(shape.experts, hidden, inter)
    ids, weights = random_routing(1, shape.experts, shape.top_k)
    moe_args = (xm, ids, weights, *experts.args(), 0, shape.experts, shape.swiglu_limit, 1.0,
                False)
    lin = ops["linear"]._linear_op._backend_fns["cuda"]
    mlp = ops["mlp"]._mlp_op._backend_fns["cuda"]
    moe_mod = ops["moe"]

    def moe_first():
        moe_mod._check(*moe_args[:13])
        _device.require_supported_gpu(xm.device)
        kernels.cuda_kernel("moe")(*moe_args[:12], wperm=False,
                                   global_num_experts=shape.experts)

    def moe_repeat():
        moe_mod._repeats.find(moe_args[:3], moe_args[3:9], moe_args[9:])

    def lin_checked():
        ops["linear"]._check(x, w, ws, wg, None)
        _device.require_supported_gpu(x.device)
        kernels.cuda_kernel("linear")(x, w, ws, wg, None, wfrag=True)(x)

    def mlp_checked():
        ops["mlp"]._check(xm, w13, s13, g13, w2, s2, g2, shape.swiglu_limit)
        _device.require_supported_gpu(xm.device)
        kernels.cuda_kernel("mlp")(xm, w13, s13, g13, w2, s2, g2, shape.swiglu_limit,
                                   wfrag=True)(xm)

    from nvfp4_ops.ops import _eager

    moe_weights = moe_args[3:9]

    def read_weight_metadata():  # what a repeat's signature must read, nothing built
        for t in moe_weights:
            t.data_ptr(), t.dtype, t.shape, t.stride()

    lin_call = lambda: lin(x, w, ws, wg, None, True)  # noqa: E731
    mlp_call = lambda: mlp(xm, w13, s13, g13, w2, s2, g2, shape.swiglu_limit, True)  # noqa: E731
    lin_call(), mlp_call()
    moe_mod._repeats.keep(
        moe_args[:3], moe_args[3:9], moe_args[9:], object())
    # what a CuTeDSL binary's argument passing costs (tvm-ffi's no-op test function, twelve
    # operands as a GEMM launch passes them): torch tensors are converted on every call,
    # tvm-ffi tensors made once (tvm_ffi.from_dlpack) are not
    import tvm_ffi

    nop = tvm_ffi.get_global_func("testing.nop")
    operands = [torch.zeros(4, 4) for _ in range(12)]
    ffi_operands = [tvm_ffi.from_dlpack(t) for t in operands]
    cases = {
        "linear M=1 (7168, 18432): checked call": lin_checked,
        "linear: repeat (kept launch)": lin_call,
        "mlp T=1 (V4-Flash): checked call": mlp_checked,
        "mlp: repeat (kept launch)": mlp_call,
        "moe T=1 (V4-Flash): checked, to 1st launch": moe_first,
        "moe: repeat, to 1st launch": moe_repeat,
        "moe repeat: its six weights' signature": lambda: _eager._weight_sig(moe_weights),
        "moe repeat: their metadata read only": read_weight_metadata,
        "tvm-ffi call, 12 torch tensors": lambda: nop(*operands),
        "tvm-ffi call, 2 torch + 10 tvm-ffi tensors": lambda: nop(*operands[:2],
                                                                  *ffi_operands[2:]),
        "tvm-ffi call, 12 tvm-ffi tensors": lambda: nop(*ffi_operands),
    }
    lookups: dict = {}
    host = _best_us(lambda: [lookups.get(i) for i in range(200)], args.calls)
    print(f"torch {torch.__version__}; host speed: 200 dict lookups {host:.2f} µs")
    print(f"{'path (binaries a no-op)':42s} {'host µs':>8s}")
    for name, fn in cases.items():
        print(f"{name:42s} {_best_us(fn, args.calls):8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
