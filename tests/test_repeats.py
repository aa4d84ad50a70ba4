"""Eager calls that repeat a checked call reuse its prepared launch
(:class:`nvfp4_ops.ops._eager.Repeats`), and never when anything the checks read changed.

CPU only: the memo itself on CPU tensors, then the ops' CUDA registrations called directly
with CPU tensors, the GPU check faked and the GEMM binaries replaced by a stand-in that
computes the reference from the arguments it is handed (so what a kept launch passes to the
binary is checked too, not only that it ran). On the GPU the same paths run in
``tests/test_linear_gpu.py`` (repeated eager calls following weight updates).
"""

from __future__ import annotations

import gc
import importlib
import weakref

import pytest
import torch

import nvfp4_ops
from nvfp4_ops import _device
from nvfp4_ops.ops._eager import Repeats
from nvfp4_ops.reference import clamped_swiglu, linear_fp32, linear_reference, mlp_reference
from nvfp4_ops.testing import random_nvfp4

linear_op = importlib.import_module("nvfp4_ops.ops.linear")
mlp_op = importlib.import_module("nvfp4_ops.ops.mlp")
moe_op = importlib.import_module("nvfp4_ops.ops.moe")

N, K = 256, 512


def _weights():
    weight, scale, global_scale = random_nvfp4(N, K)
    return [weight, scale, global_scale, None]


def _kept(repeats, x, weights, scalars=(False,)):
    launch = object()
    repeats.keep((x,), tuple(weights), scalars, launch)
    return launch


# --- the memo ---------------------------------------------------------------------------------


def test_a_repeat_finds_its_launch_and_an_in_place_write_keeps_it():
    repeats, weights = Repeats(), _weights()
    x = torch.randn(3, K).to(torch.bfloat16)
    launch = _kept(repeats, x, weights)
    assert repeats.find((x,), tuple(weights), (False,)) is launch
    # new activations of the same metadata: the same launch
    assert repeats.find((torch.zeros(3, K, dtype=torch.bfloat16),), tuple(weights),
                        (False,)) is launch
    weights[0].copy_(torch.randint(0, 256, weights[0].shape, dtype=torch.uint8))
    assert repeats.find((x,), tuple(weights), (False,)) is launch  # reads memory anyway


@pytest.mark.parametrize("change", [
    "x rows", "x dtype", "x strides", "scalar", "other weight object", "storage swapped",
    "same address other shape", "same address other dtype", "in-place transpose",
])
def test_anything_the_checks_read_misses(change):
    repeats, weights = Repeats(), _weights()
    x = torch.randn(4, K).to(torch.bfloat16)
    _kept(repeats, x, weights)
    scalars = (False,)
    if change == "x rows":
        x = torch.randn(5, K).to(torch.bfloat16)
    elif change == "x dtype":
        x = x.float()
    elif change == "x strides":
        x = torch.randn(K, 4).to(torch.bfloat16).t()
    elif change == "scalar":
        scalars = (True,)
    elif change == "other weight object":
        weights[1] = weights[1].clone()
    elif change == "storage swapped":
        weights[2].data = weights[2] * 2  # what vLLM's loaders do
    elif change == "same address other shape":
        weights[0].data = weights[0].data.view(2 * N, K // 4)
    elif change == "same address other dtype":
        weights[0].data = weights[0].data.view(torch.int8)
    elif change == "in-place transpose":
        square = torch.zeros(64, 64, dtype=torch.uint8)
        weights[0] = square
        _kept(repeats, x, weights)
        square.t_()
    assert repeats.find((x,), tuple(weights), scalars) is None


@pytest.mark.parametrize("how", ["backend", "env", "override"])
def test_a_switch_change_misses_and_value_checks_keep_nothing(monkeypatch, how):
    repeats, weights = Repeats(), _weights()
    x = torch.randn(2, K).to(torch.bfloat16)
    _kept(repeats, x, weights)
    if how == "backend":
        monkeypatch.setenv("NVFP4_OPS_BACKEND", "reference")
    elif how == "env":
        monkeypatch.setenv("NVFP4_OPS_VALUE_CHECKS", "1")
    else:
        monkeypatch.setattr("nvfp4_ops._validate._value_checks", None)  # restored after
        nvfp4_ops.set_value_checks(True)
    assert repeats.find((x,), tuple(weights), (False,)) is None
    if how != "backend":  # while the per-call value checks are on, nothing is kept
        _kept(repeats, x, weights)
        assert repeats.find((x,), tuple(weights), (False,)) is None and len(repeats) == 1


def test_an_entry_goes_with_its_weights():
    repeats, weights = Repeats(), _weights()
    x = torch.randn(2, K).to(torch.bfloat16)
    _kept(repeats, x, weights)
    _kept(repeats, torch.randn(7, K).to(torch.bfloat16), weights)
    assert len(repeats) == 2
    alive = weakref.ref(weights[1])
    del weights[1]
    gc.collect()
    assert alive() is None and len(repeats) == 0


def test_the_memo_is_bounded(monkeypatch):
    repeats, weights = Repeats(), _weights()
    monkeypatch.setattr(Repeats, "PER_WEIGHTS", 4)
    for rows in range(1, 7):
        _kept(repeats, torch.zeros(rows, K, dtype=torch.bfloat16), weights)
    assert len(repeats) <= 4


# --- through the ops' CUDA registrations ------------------------------------------------------


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """The ops' CUDA registrations on CPU tensors: a Hopper GPU faked, the GEMM binaries
    replaced by the reference on the arguments they receive. Returns the calls seen, by
    kind: ``check`` (the op's full check), ``prepare`` (a launch built), ``gemm``."""
    pytest.importorskip("cutlass")  # the dispatch imports the kernel modules
    from nvfp4_ops import kernels
    from nvfp4_ops.kernels import linear_cuda

    seen = {"check": 0, "prepare": 0, "gemm": 0}
    monkeypatch.setattr(_device, "_supported", {None: True})

    def fake_compiled(cfg):
        def gemm(a, w, w_scale, w_global, out, tile_expert, tile_rows, row_scale, bias,
                 counters, scratch, limit):
            seen["gemm"] += 1
            if cfg.grouped:  # the MoE: only the flow is checked here
                out.zero_()
                return
            rows = w_global[0].reshape(-1)  # per output row, any view
            if cfg.epilogue == "swiglu":
                y = linear_fp32(a, w[0], w_scale[0].view(torch.float8_e4m3fn), rows)
                half = y.shape[1] // 2
                out.copy_(clamped_swiglu(y[:, :half], y[:, half:], limit).to(torch.bfloat16))
            else:
                out.copy_(linear_reference(a, w[0], w_scale[0].view(torch.float8_e4m3fn),
                                           rows, bias if cfg.has_bias else None))

        return gemm

    monkeypatch.setattr(linear_cuda, "compiled", fake_compiled)
    for mod in (linear_op, mlp_op, moe_op):
        real_check = mod._check

        def counted(*args, _real=real_check):
            seen["check"] += 1
            return _real(*args)

        monkeypatch.setattr(mod, "_check", counted)
        monkeypatch.setattr(mod, "_repeats", Repeats())
    real_kernel = kernels.cuda_kernel

    def counted_kernel(op):
        prepare = real_kernel(op)
        if prepare is None:
            return None

        def counted_prepare(*args, **kwargs):
            seen["prepare"] += 1
            return prepare(*args, **kwargs)

        return counted_prepare

    monkeypatch.setattr(kernels, "cuda_kernel", counted_kernel)
    return seen


def _linear_cuda(*args):
    return linear_op._linear_op._backend_fns["cuda"](*args)


def test_linear_repeats_skip_the_checks_and_follow_weight_updates(kernels_on_cpu):
    seen = kernels_on_cpu
    weight, scale, global_scale = random_nvfp4(N, K)
    bias = torch.randn(N).to(torch.bfloat16)
    x = torch.randn(3, K).to(torch.bfloat16)

    def call(x):
        out = _linear_cuda(x, weight, scale, global_scale, bias, False)
        assert torch.equal(out, linear_reference(x, weight, scale, global_scale, bias))
        return out

    call(x)
    assert seen == {"check": 1, "prepare": 1, "gemm": 1}
    first = call(torch.randn(3, K).to(torch.bfloat16))  # a repeat: no check, no new launch
    assert seen == {"check": 1, "prepare": 1, "gemm": 2}
    global_scale.data = global_scale * 4  # a new storage: checked and prepared again
    call(x)
    assert seen == {"check": 2, "prepare": 2, "gemm": 3}
    call(torch.randn(5, K).to(torch.bfloat16))  # another size: its own launch
    assert seen["prepare"] == 3 and first.shape == (3, N)


def test_linear_bad_input_after_a_repeat_still_raises(kernels_on_cpu):
    weight, scale, global_scale = random_nvfp4(N, K)
    x = torch.randn(2, K).to(torch.bfloat16)
    _linear_cuda(x, weight, scale, global_scale, None, False)
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="x"):
        _linear_cuda(x.float(), weight, scale, global_scale, None, False)
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="weight"):  # K no longer matches
        _linear_cuda(torch.randn(2, K + 32).to(torch.bfloat16), weight, scale, global_scale,
                     None, False)
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="contiguous"):
        _linear_cuda(torch.randn(K, 2).to(torch.bfloat16).t(), weight, scale, global_scale,
                     None, False)
    global_scale.data = global_scale.reshape(1)  # same address, another shape
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="global_scale"):
        _linear_cuda(x, weight, scale, global_scale, None, False)


def test_linear_repeats_follow_the_backend_switch(kernels_on_cpu, monkeypatch):
    seen = kernels_on_cpu
    weight, scale, global_scale = random_nvfp4(N, K)
    x = torch.randn(2, K).to(torch.bfloat16)
    _linear_cuda(x, weight, scale, global_scale, None, False)
    monkeypatch.setenv("NVFP4_OPS_BACKEND", "reference")
    out = _linear_cuda(x, weight, scale, global_scale, None, False)
    assert seen["gemm"] == 1 and torch.equal(out, linear_reference(x, weight, scale,
                                                                   global_scale))


def test_a_kept_launch_holds_no_weight(kernels_on_cpu):
    weight, scale, global_scale = random_nvfp4(N, K)
    bias = torch.randn(N).to(torch.bfloat16)
    x = torch.randn(2, K).to(torch.bfloat16)
    _linear_cuda(x, weight, scale, global_scale, bias, False)
    assert len(linear_op._repeats) == 1
    refs = [weakref.ref(t) for t in (weight, scale, global_scale, bias)]
    del weight, scale, global_scale, bias
    gc.collect()
    assert all(r() is None for r in refs) and len(linear_op._repeats) == 0


def test_mlp_repeats_keep_one_launch_per_limit(kernels_on_cpu):
    seen = kernels_on_cpu
    hidden, inter = 256, 128
    w13, s13, _ = random_nvfp4(2 * inter, hidden)
    w2, s2, g2 = random_nvfp4(hidden, inter)
    g13 = torch.tensor([0.5, 2.0])
    x = torch.randn(3, hidden).to(torch.bfloat16)
    mlp_cuda = mlp_op._mlp_op._backend_fns["cuda"]
    for limit, prepared in ((7.0, 1), (7.0, 1), (0.25, 2), (7, 2)):
        out = mlp_cuda(x, w13, s13, g13, w2, s2, g2, limit, False)
        assert seen["prepare"] == prepared
        want = mlp_reference(x, w13, s13, g13, w2, s2, g2, limit)
        assert torch.equal(out, want), limit
    with pytest.raises(nvfp4_ops.NVFP4InputError, match="swiglu_limit"):
        mlp_cuda(x, w13, s13, g13, w2, s2, g2, float("nan"), False)


def test_moe_repeats_skip_the_checks_and_the_plan(kernels_on_cpu):
    """The MoE's kept launch (routing, gather and combine run for real: Triton's interpreter
    on CPU; the grouped GEMMs write zeros) is reused for new routing of the same sizes, and
    a new ``expert_start`` or token count is checked and planned again."""
    from nvfp4_ops.testing import random_experts, random_routing

    seen = kernels_on_cpu
    experts, hidden, inter, tokens, top_k = 4, 256, 128, 5, 2
    expert_args = list(random_experts(experts, hidden, inter).args())
    moe_cuda = moe_op._moe_op._backend_fns["cuda"]

    def call(num_tokens=tokens, expert_start=0, ex=expert_args):
        x = torch.randn(num_tokens, hidden).to(torch.bfloat16)
        ids, weights = random_routing(num_tokens, experts, top_k)
        out = moe_cuda(x, ids + expert_start, weights, *ex, expert_start, -1, 10.0,
                       1.0, False)
        assert out.shape == (num_tokens, hidden) and not out.any()

    call()
    assert (seen["check"], seen["prepare"], seen["gemm"]) == (1, 1, 2)
    call()  # new hidden states and routing, same sizes: a repeat
    assert (seen["check"], seen["prepare"], seen["gemm"]) == (1, 1, 4)
    call(expert_start=4)
    call(num_tokens=3)
    assert (seen["check"], seen["prepare"]) == (3, 3)
    refs = [weakref.ref(t) for t in expert_args]
    expert_args.clear()  # the last references (call's default holds the emptied list)
    gc.collect()
    assert all(r() is None for r in refs) and len(moe_op._repeats) == 0
