"""Warm-up from the model's layers (``nvfp4_ops.warmup(layers=...)``): what it reaches on the CPU
(compile only), and on the GPU that after it no kernel compiles while CUDA graphs are captured
at every batch size vLLM captures by default."""

from __future__ import annotations

import os

import pytest
import torch

import nvfp4_ops
from nvfp4_ops import _compile, _warmup

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

#: vLLM 0.33's default CUDA-graph capture sizes (CompilationConfig: [1, 2, 4], then every 8 up
#: to 248, then every 16 up to max_cudagraph_capture_size = 512)
VLLM_CAPTURE_SIZES = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))


@pytest.fixture
def guard_reset():
    yield
    _compile.set_no_compile_after_warmup(None)
    _compile.mark_warm(False)


def test_layers_reach_what_the_ops_launch():
    """The plans a layer list reaches hold every plan its ops launch at any token count."""
    pytest.importorskip("cutlass")
    from nvfp4_ops.kernels import dispatch as D

    layers = [nvfp4_ops.LinearLayer(1536, 4096, wfrag=True),
              nvfp4_ops.LinearLayer(4096, 2048, has_bias=True),
              nvfp4_ops.MLPLayer(4096, 2048),
              nvfp4_ops.MoELayer(32, 4096, 2048, 6, wperm=True)]
    names = {p.config.name for p in _warmup.plans_for(layers)}
    for m in (1, 5, 16, 31, 64, 100, 256, 300, 5000):
        assert D.plan_linear(1536, 4096, m, order=D.WeightOrder.WFRAG).config.name in names
        assert D.plan_linear(4096, 2048, m, has_bias=True).config.name in names
        assert {p.config.name for p in D.plan_mlp(4096, 2048, m)} <= names
    for t in (1, 3, 20, 100, 1000, 20000):
        for e in (32, 4):  # any expert count: the grouped configs do not depend on it
            plan = D.plan_moe(t, 6, e, 4096, 2048, order=D.WeightOrder.WPERM)
            assert {plan.gate_up.config.name, plan.down.config.name} <= names


def test_warmup_rejects_unknown_layers():
    with pytest.raises(ValueError, match="LinearLayer, MLPLayer or MoELayer"):
        nvfp4_ops.warmup(layers=[(4096, 4096)], run=False)


def test_a_repeated_warmup_runs_only_what_did_not_run(guard_reset, monkeypatch):
    """With ``run``, a variant that already ran on this device is not run (nor listed) again,
    unless its binary changed (the memory cache was cleared); the device side is stood in for,
    so this runs on the CPU."""
    import torch

    from nvfp4_ops import _device, _warmup
    from nvfp4_ops.kernels import linear_cuda, moe_cuda

    binaries, ran, triton = {}, [], []
    monkeypatch.setattr(_warmup, "_ran", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(_device, "require_supported_gpu", lambda device: None)
    monkeypatch.setattr(linear_cuda, "compiled",
                        lambda config: binaries.setdefault(config.name, object()))
    monkeypatch.setattr(linear_cuda, "run_once", lambda plan: ran.append(plan.config.name))
    monkeypatch.setattr(moe_cuda, "warmup_triton",
                        lambda h, k, tiles: triton.append((h, k)) or [f"triton_{h}_{k}"])
    dense = nvfp4_ops.LinearLayer(4096, 4096, wfrag=True)
    moe = nvfp4_ops.MoELayer(8, 256, 128, 6)
    first = nvfp4_ops.warmup(layers=[dense], run=True)
    assert first and sorted(ran) == sorted(first)
    assert nvfp4_ops.warmup(layers=[dense], run=True) == [] and len(ran) == len(first)
    both = nvfp4_ops.warmup(layers=[dense, moe], run=True)
    assert both[-1] == "triton_256_6" and triton == [(256, 6)]
    assert not set(both) & set(first)  # only the MoE's variants were new
    assert nvfp4_ops.warmup(layers=[moe], run=True) == [] and triton == [(256, 6)]
    binaries.clear()  # reloaded binaries (a cleared memory cache) run again
    assert sorted(nvfp4_ops.warmup(layers=[dense], run=True)) == sorted(first)


def test_a_later_warmup_may_compile_under_the_guard(guard_reset, tmp_path, monkeypatch):
    """The guard forbids compiles after warm-up, except in a later warm-up (a layer loaded
    after the first warmed its own): compile-only, a small dense layer."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("NVFP4_OPS_CACHE_DIR", str(tmp_path))
    _compile.clear_memory_cache()
    _compile.set_no_compile_after_warmup(True)
    first = nvfp4_ops.warmup(layers=[nvfp4_ops.LinearLayer(256, 256)], run=False)
    assert first and _compile.is_warm()
    more = nvfp4_ops.warmup(layers=[nvfp4_ops.LinearLayer(512, 256)], run=False)
    assert more and _compile.is_warm()
    from nvfp4_ops.kernels import dispatch, linear_cuda

    with pytest.raises(_compile.CompileAfterWarmupError):
        linear_cuda.compiled(dispatch.plan_linear(768, 256, 1).config)


def _triton_variants() -> int:
    """How many compiled variants the MoE's Triton kernels hold (all devices)."""
    from nvfp4_ops.kernels.triton import moe_combine, moe_routing

    total = 0
    for mod in (moe_routing, moe_combine):
        for fn in vars(mod).values():
            caches = getattr(fn, "device_caches", None)
            if caches is not None:
                total += sum(len(entry[0]) for entry in caches.values())
    return total


@pytest.mark.gpu
def test_no_compile_while_capturing_every_vllm_batch_size(guard_reset):
    """Warm up from a V4-Flash layer list (its MoE on wperm weights, two prepared dense
    layers), turn the guard on, then capture a CUDA graph of the layers at every batch size
    vLLM captures by default and replay it: no CuTeDSL compile (the guard would raise) and no
    new Triton variant."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from nvfp4_ops.testing import fast_random_experts, random_routing

    s = nvfp4_ops.get_shape("v4-flash")
    gen = torch.Generator(device="cuda").manual_seed(0)
    e, h, i = s.experts, s.hidden, s.intermediate
    moe_weights = fast_random_experts(e, h, i, device="cuda")
    nvfp4_ops.to_wperm_(moe_weights.w13)
    nvfp4_ops.to_wperm_(moe_weights.w2)
    experts = moe_weights.args()
    dense = []
    for n, k in ((2 * s.shared_intermediate, h), (1536, h)):
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
        ws = (torch.rand(n, k // 16, device="cuda", generator=gen) + 0.5).to(torch.float8_e4m3fn)
        dense.append((nvfp4_ops.to_wfrag_(w), ws, torch.full((n,), 1e-3, device="cuda")))
    layers = [nvfp4_ops.MoELayer(e, h, i, s.top_k, wperm=True),
              *[nvfp4_ops.LinearLayer(w.shape[0], 2 * w.shape[1], wfrag=True)
                for w, _, _ in dense]]
    nvfp4_ops.warmup(layers=layers)
    _compile.set_no_compile_after_warmup(True)
    compiles, variants = _compile.compile_count(), _triton_variants()
    for t in VLLM_CAPTURE_SIZES:
        x = torch.randn(t, h, device="cuda", generator=gen).to(torch.bfloat16)
        ids, weights = random_routing(t, e, s.top_k, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = nvfp4_ops.moe(x, ids, weights, *experts, global_num_experts=e,
                                swiglu_limit=s.swiglu_limit, wperm=True)
            ys = [nvfp4_ops.linear(x, w, ws, wg, wfrag=True) for w, ws, wg in dense]
        graph.replay()
        torch.cuda.synchronize()
        assert not out.isnan().any() and all(not y.isnan().any() for y in ys), f"T={t}"
    assert _compile.compile_count() == compiles
    assert _triton_variants() == variants, "a Triton kernel compiled during capture"
