"""The validation contract (:mod:`nvfp4_ops._validate`): host data checked every call, weight
data once by ``check_*_weights``, per-call device data only with ``NVFP4_OPS_VALUE_CHECKS=1``
and never during CUDA-graph capture; the GPU capability check (:mod:`nvfp4_ops._device`).
Error messages themselves are in test_errors.py."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

import nvfp4_ops
from nvfp4_ops import NVFP4InputError, _device, _validate
from nvfp4_ops.testing import capture_graph, random_experts, random_nvfp4, random_routing

H, INTER, E, K, T = 64, 32, 4, 2, 6


@pytest.fixture(autouse=True)
def default_switches(monkeypatch):
    """Each test starts from the defaults: value checks off, backend auto."""
    monkeypatch.delenv("NVFP4_OPS_VALUE_CHECKS", raising=False)
    monkeypatch.delenv("NVFP4_OPS_BACKEND", raising=False)
    nvfp4_ops.set_value_checks(None)
    yield
    nvfp4_ops.set_value_checks(None)


@pytest.fixture(scope="module")
def experts():
    torch.manual_seed(3)
    return random_experts(E, H, INTER, up_scale_ratio=2.0)


def _moe(hidden, ids, weights, ex, **kw):
    return nvfp4_ops.moe(hidden, ids, weights, *ex.args(), **kw)


# --- the default contract: no device data is read per call ----------------------------------


def test_value_checks_are_off_by_default_and_follow_the_switch(monkeypatch):
    x = torch.zeros(1)
    assert not _validate.value_checks_enabled(x)
    monkeypatch.setenv("NVFP4_OPS_VALUE_CHECKS", "1")
    assert _validate.value_checks_enabled(x)
    assert not _validate.value_checks_enabled(torch.zeros(1, device="meta"))  # no data there
    nvfp4_ops.set_value_checks(False)  # the override wins over the environment
    assert not _validate.value_checks_enabled(x)
    nvfp4_ops.set_value_checks(None)
    assert _validate.value_checks_enabled(x)


def test_ops_do_not_read_scale_values_per_call(experts):
    """A NaN global scale is not looked at per call (it is what check_*_weights is for): the
    op runs and the NaN shows in the output."""
    torch.manual_seed(4)
    x = torch.randn(T, H).to(torch.bfloat16)
    bad_global = experts.w2_global.clone()
    bad_global[0] = math.nan
    ids = torch.zeros(T, K, dtype=torch.int32)
    ids[:, 1] = 1
    out = nvfp4_ops.moe(x, ids, torch.full((T, K), 0.5), experts.w13, experts.w13_scale,
                        experts.w13_global, experts.w2, experts.w2_scale, bad_global)
    assert out.isnan().all()
    p, s, g = random_nvfp4(16, H)
    y = nvfp4_ops.linear(x, p, s, torch.tensor(0.0))
    assert torch.equal(y, torch.zeros_like(y))


def test_bad_ids_contribute_nothing_by_default(experts):
    """Ids no rank can own (negative, past global_num_experts) are dropped like another
    rank's ids: the same result as giving those slots zero weight."""
    torch.manual_seed(5)
    x = torch.randn(T, H).to(torch.bfloat16)
    ids, weights = random_routing(T, E, K)
    bad = ids.clone()
    bad[0, :] = -3
    bad[1, 0] = 1000
    bad[2, 1] = E  # == global_num_experts
    out = _moe(x, bad, weights, experts, global_num_experts=E, swiglu_limit=8.0)
    zeroed = weights.clone()
    zeroed[bad != ids] = 0.0
    want = _moe(x, ids, zeroed, experts, global_num_experts=E, swiglu_limit=8.0)
    assert torch.equal(out, want)
    assert torch.equal(out[0], torch.zeros_like(out[0]))


def test_debug_checks_read_ids_when_switched_on(experts, monkeypatch):
    x = torch.randn(T, H).to(torch.bfloat16)
    ids, weights = random_routing(T, E, K)
    ids[3, 1] = E
    _moe(x, ids, weights, experts, global_num_experts=E)  # off: no error
    nvfp4_ops.set_value_checks(True)
    with pytest.raises(NVFP4InputError, match=r"topk_ids must be global expert ids in \[0, 4\)"):
        _moe(x, ids, weights, experts, global_num_experts=E)


def test_verified_scale_cache_is_gone():
    """No cache of "already verified" tensors (it keyed on the version counter, which
    ``.data`` writes do not bump)."""
    assert not hasattr(_validate, "_VERIFIED_SCALES")


def test_swiglu_limit_inf_is_no_clamp(experts):
    torch.manual_seed(6)
    x = (torch.randn(T, H) * 4).to(torch.bfloat16)
    ids, weights = random_routing(T, E, K)
    assert torch.equal(_moe(x, ids, weights, experts, swiglu_limit=math.inf),
                       _moe(x, ids, weights, experts, swiglu_limit=None))
    w = {n: getattr(experts, n)[0] for n in ("w13", "w13_scale", "w13_global", "w2",
                                               "w2_scale", "w2_global")}
    assert torch.equal(nvfp4_ops.mlp(x, *w.values(), swiglu_limit=math.inf),
                       nvfp4_ops.mlp(x, *w.values(), swiglu_limit=None))


def test_scalar_checks_run_in_the_fake_under_compile(experts):
    """Python scalars are checked in the fake: torch.compile fails at trace time."""
    x = torch.randn(T, H).to(torch.bfloat16)
    ids, weights = random_routing(T, E, K)

    @torch.compile(fullgraph=True, backend="eager")
    def f(x, ids, weights):
        return _moe(x, ids, weights, experts, expert_start=2, global_num_experts=5)

    with pytest.raises(Exception, match=r"expert_start \+ E = 2 \+ 4 exceeds"):
        f(x, ids, weights)


# --- weight checks once ------------------------------------------------------------------------


def test_weight_checks_pass_on_good_weights(experts):
    nvfp4_ops.check_moe_weights(*experts.args())
    nvfp4_ops.check_moe_weights(*experts.args(), where="layer.0.experts")
    e0 = [t[0] for t in experts.args()]
    nvfp4_ops.check_mlp_weights(*e0)
    p, s, g = random_nvfp4(48, H)
    nvfp4_ops.check_linear_weights(p, s, g)
    nvfp4_ops.check_linear_weights(p, s.view(torch.uint8), g.expand(48).contiguous(),
                                   torch.zeros(48, dtype=torch.bfloat16))


def test_weight_checks_take_per_row_global_scales(experts):
    w13_rows = experts.w13_global.repeat_interleave(INTER, dim=1)  # [E, 2I]
    w2_rows = experts.w2_global[:, None].expand(E, H).contiguous()  # [E, H]
    nvfp4_ops.check_moe_weights(experts.w13, experts.w13_scale, w13_rows, experts.w2,
                                experts.w2_scale, w2_rows)
    nvfp4_ops.check_mlp_weights(experts.w13[0], experts.w13_scale[0], w13_rows[0],
                                experts.w2[0], experts.w2_scale[0], w2_rows[0])


def test_weight_checks_accept_zero_and_negative_zero_block_scales(experts):
    s = experts.w2_scale.clone()
    s.view(torch.uint8)[0, 0, 0] = 0x00
    s.view(torch.uint8)[0, 0, 1] = 0x80  # -0: a zero block either way
    nvfp4_ops.check_moe_weights(experts.w13, experts.w13_scale, experts.w13_global, experts.w2,
                                s, experts.w2_global)


def test_weight_checks_skip_values_on_meta(experts):
    meta = [t.to("meta") for t in experts.args()]
    nvfp4_ops.check_moe_weights(*meta)  # shapes only: meta tensors hold no data


def test_weight_scan_in_chunks_finds_the_first_bad_entry(experts, monkeypatch):
    """The block-scale scan runs in bounded chunks; a bad byte in a later chunk is found with
    its index and the bad count summed over chunks."""
    monkeypatch.setattr(_validate, "_SCAN_BYTES", 100)
    s = experts.w13_scale.clone()
    b = s.view(torch.uint8)
    b[2, 10, 3] = 0x7F
    b[3, 63, 3] = 0xF0
    with pytest.raises(NVFP4InputError,
                       match=r"w13_scale must hold .* got NaN \(byte 0x7f\) at index \(2, 10, 3\) "
                             r"\(2 bad of 1024\)"):
        nvfp4_ops.check_moe_weights(experts.w13, s, experts.w13_global, experts.w2,
                                    experts.w2_scale, experts.w2_global)


def test_weight_checks_see_prepared_weights(experts):
    """Values do not depend on the code order: wperm-prepared MoE codes check the same."""
    w13, w2 = experts.w13.clone(), experts.w2.clone()
    nvfp4_ops.to_wperm_(w13)
    nvfp4_ops.to_wperm_(w2)
    nvfp4_ops.check_moe_weights(w13, experts.w13_scale, experts.w13_global, w2,
                                experts.w2_scale, experts.w2_global)


# --- the meta checks stay cheap ---------------------------------------------------------------


def test_meta_checks_allocate_no_tensors(experts, monkeypatch):
    """Per-call checks touch metadata only: no tensor op runs (so nothing can sync)."""
    x = torch.randn(T, H).to(torch.bfloat16)
    ids, weights = random_routing(T, E, K)
    moe_mod = importlib.import_module("nvfp4_ops.ops.moe")
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        calls: list = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Count() as mode:
        moe_mod._check(x, ids, weights, *experts.args(), 0, E, 10.0, 1.0)
    tensor_ops = [c for c in mode.calls if c not in (
        "dtype", "shape", "device", "dim", "is_contiguous", "is_cuda", "__get__", "stride",
        "__len__", "size")]
    assert not tensor_ops, tensor_ops


# --- GPU capability -----------------------------------------------------------------------------


@pytest.fixture
def fake_gpu(monkeypatch):
    """Pretend cuda:0 is a given GPU (no CUDA needed): returns a setter."""
    monkeypatch.setattr(_device, "_supported", {})
    monkeypatch.setattr(_device, "_current_index", lambda: 0)
    queries = []

    def set_gpu(name, capability):
        def cap(index):
            queries.append(index)
            return capability
        monkeypatch.setattr(_device, "_capability", cap)
        monkeypatch.setattr(_device, "_name", lambda index: name)
        return queries

    return set_gpu


def test_non_hopper_gpu_is_refused_by_name(fake_gpu):
    fake_gpu("NVIDIA A100-SXM4-80GB", (8, 0))
    with pytest.raises(nvfp4_ops.NVFP4UnsupportedGPUError) as info:
        _device.require_supported_gpu(torch.device("cuda", 0))
    msg = str(info.value)
    for part in ("NVIDIA A100-SXM4-80GB", "compute capability 8.0", "compute capability 9.0",
                 "cuda:0", "NVFP4_OPS_BACKEND=reference", "Hopper"):
        assert part in msg, (part, msg)


def test_blackwell_is_refused_too(fake_gpu):
    fake_gpu("NVIDIA B200", (10, 0))
    with pytest.raises(nvfp4_ops.NVFP4UnsupportedGPUError, match=r"NVIDIA B200 with compute "
                                                                  r"capability 10\.0"):
        _device.require_supported_gpu(torch.device("cuda", 0))


def test_hopper_passes_and_is_cached(fake_gpu):
    queries = fake_gpu("NVIDIA H200", (9, 0))
    for _ in range(3):
        _device.require_supported_gpu(torch.device("cuda", 0))
    assert queries == [0]  # one capability query; later calls are one dict lookup


def test_reference_backend_runs_anywhere(fake_gpu, monkeypatch):
    queries = fake_gpu("NVIDIA A100-SXM4-80GB", (8, 0))
    monkeypatch.setenv("NVFP4_OPS_BACKEND", "reference")
    _device.require_supported_gpu(torch.device("cuda", 0))
    assert queries == []
    monkeypatch.setenv("NVFP4_OPS_BACKEND", "auto")  # not cached as supported
    with pytest.raises(nvfp4_ops.NVFP4UnsupportedGPUError):
        _device.require_supported_gpu(torch.device("cuda", 0))


@pytest.mark.parametrize("op", ["linear", "mlp", "moe"])
def test_cuda_registrations_check_the_gpu_first(fake_gpu, experts, op):
    """Each op's CUDA path calls the check before it looks its kernel up (called directly
    here with CPU tensors, the capability query faked)."""
    fake_gpu("Tesla V100-SXM2-32GB", (7, 0))
    mod = importlib.import_module(f"nvfp4_ops.ops.{op}")
    cuda_fn = getattr(mod, f"_{op}_op")._backend_fns["cuda"]
    x = torch.randn(T, H).to(torch.bfloat16)
    if op == "linear":
        args = (x, *random_nvfp4(16, H), None)
    elif op == "mlp":
        args = (x, *(t[0] for t in experts.args()), 10.0)
    else:
        ids, weights = random_routing(T, E, K)
        args = (x, ids, weights, *experts.args(), 0, -1, 10.0, 1.0)
    with pytest.raises(nvfp4_ops.NVFP4UnsupportedGPUError, match="Tesla V100-SXM2-32GB"):
        cuda_fn(*args)


# --- on the GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_eager_calls_do_not_sync():
    """With the default switches an eager call reads no device data: under
    ``torch.cuda.set_sync_debug_mode("error")`` a second (warm) call of each op passes."""
    tiny = nvfp4_ops.get_shape("tiny")
    torch.manual_seed(7)
    ex = random_experts(tiny.experts, tiny.hidden, tiny.intermediate, device="cuda")
    x = torch.randn(3, tiny.hidden, device="cuda").to(torch.bfloat16)
    ids, weights = random_routing(3, tiny.experts, tiny.top_k, device="cuda")
    p, s, g = random_nvfp4(4096, 4096, device="cuda")
    xl = torch.randn(1, 4096, device="cuda").to(torch.bfloat16)
    e0 = [t[0] for t in ex.args()]
    calls = {
        "moe": lambda: nvfp4_ops.moe(x, ids, weights, *ex.args(),
                                     global_num_experts=tiny.experts,
                                     swiglu_limit=tiny.swiglu_limit),
        "linear": lambda: nvfp4_ops.linear(xl, p, s, g),
        "mlp": lambda: nvfp4_ops.mlp(x, *e0, swiglu_limit=tiny.swiglu_limit),
    }
    for fn in calls.values():
        fn()  # compile / load outside the check
    torch.cuda.synchronize()
    for what, fn in calls.items():
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        assert not out.isnan().any(), what


@pytest.mark.gpu
def test_gpu_debug_checks_skip_capture_and_bad_ids_contribute_nothing(monkeypatch):
    """With ``NVFP4_OPS_VALUE_CHECKS=1`` an eager call with an impossible id raises, capture
    reads nothing (no error, no sync), and the replayed graph drops that id."""
    from nvfp4_ops.reference import moe_reference
    from nvfp4_ops.testing import rel_l2

    tiny = nvfp4_ops.get_shape("tiny")
    torch.manual_seed(8)
    ex = random_experts(tiny.experts, tiny.hidden, tiny.intermediate, device="cuda")
    x = torch.randn(5, tiny.hidden, device="cuda").to(torch.bfloat16)
    ids, weights = random_routing(5, tiny.experts, tiny.top_k, device="cuda")

    def call():
        return nvfp4_ops.moe(x, ids, weights, *ex.args(), global_num_experts=tiny.experts,
                             swiglu_limit=tiny.swiglu_limit)

    monkeypatch.setenv("NVFP4_OPS_VALUE_CHECKS", "1")
    # compiles / loads what T = 5 needs; good ids: the debug checks pass
    graph, static_out = capture_graph(call)
    ids[1, 0] = tiny.experts  # no rank owns it
    ids[2, 3] = -1
    with pytest.raises(NVFP4InputError, match="topk_ids must be global expert ids"):
        call()
    graph.replay()
    torch.cuda.synchronize()
    dropped = weights.clone()
    dropped[1, 0] = 0.0
    dropped[2, 3] = 0.0
    good = ids.clamp(0, tiny.experts - 1)
    want = moe_reference(x, good, dropped, *ex.args(), 0, tiny.swiglu_limit, 1.0)
    assert not static_out.isnan().any()
    assert rel_l2(static_out, want) < 4e-3


@pytest.mark.gpu
def test_gpu_capability_of_this_machine_is_supported():
    """The GPU suite runs on Hopper: the check passes there and is then a dict hit."""
    _device.require_supported_gpu(torch.device("cuda", torch.cuda.current_device()))
    assert _device._supported.get(torch.cuda.current_device())


# ---------------------------------------------------------------------------- eager fast path


def test_direct_eager_path_only_for_plain_eager_cuda_calls(monkeypatch):
    """The public wrappers call the CUDA implementation directly only in a plain eager call:
    CPU tensors, a torch.compile trace, a dispatch mode (fake tensors) or autograd all take
    the dispatcher (``nvfp4_ops.ops._eager.direct``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nvfp4_ops.ops import _eager

    x = torch.zeros(2, 4)
    assert not _eager.direct(x)  # CPU
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert _eager.direct(x, None)
    assert not _eager.direct(x.requires_grad_())
    with torch.no_grad():
        assert _eager.direct(x)
    x = x.detach()
    with FakeTensorMode() as mode:
        assert not _eager.direct(mode.from_tensor(x))
    seen = []

    def traced(t):
        seen.append(_eager.direct(t))
        return t + 1

    torch.compile(traced, backend="eager", fullgraph=True)(x)
    assert seen == [False]


def test_wrappers_take_the_direct_path_in_eager(monkeypatch, experts):
    """With the predicate true, ``nvfp4_ops.linear`` / ``mlp`` / ``moe`` run their CUDA
    registrations directly (recorded here), and through torch.ops otherwise."""
    import sys

    from nvfp4_ops.ops import _eager

    # the modules (the package's attributes of these names are the wrappers)
    lin, mlp_mod, moe_mod = (sys.modules[f"nvfp4_ops.ops.{m}"] for m in ("linear", "mlp", "moe"))

    calls = []
    monkeypatch.setattr(_eager, "direct", lambda *t: True)
    for mod, name in ((lin, "_linear_cuda"), (mlp_mod, "_mlp_cuda"), (moe_mod, "_moe_cuda")):
        monkeypatch.setattr(mod, name, lambda *a, _n=name: calls.append(_n) or "direct")
    ex = experts
    x = torch.randn(3, ex.w13.shape[-1] * 2).to(torch.bfloat16)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    w = torch.ones(3, 2)
    assert nvfp4_ops.moe(x, ids, w, *ex.args()) == "direct"
    assert nvfp4_ops.mlp(x, ex.w13[0], ex.w13_scale[0], ex.w13_global[0], ex.w2[0],
                         ex.w2_scale[0], ex.w2_global[0]) == "direct"
    assert nvfp4_ops.linear(x, ex.w13[0], ex.w13_scale[0], ex.w13_global[0, 0]) == "direct"
    assert calls == ["_moe_cuda", "_mlp_cuda", "_linear_cuda"]
    monkeypatch.setattr(_eager, "direct", lambda *t: False)
    out = nvfp4_ops.linear(x, ex.w13[0], ex.w13_scale[0], ex.w13_global[0, 0])
    assert isinstance(out, torch.Tensor) and len(calls) == 3


# --- the metadata checks' fast path ---------------------------------------------------------


def _variants(t: torch.Tensor):
    """Tensors that differ from ``t`` in one metadata property each: dtype, rank, one size,
    contiguity, device."""
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64,
                  torch.uint8, torch.int8, torch.float8_e4m3fn, torch.float8_e8m0fnu):
        if dtype != t.dtype:
            yield f"dtype {dtype}", torch.zeros(t.shape, dtype=dtype)
    yield "one more dim", t.unsqueeze(0)
    if t.dim():
        yield "one dim less", t.reshape(-1) if t.dim() > 1 else t.reshape(-1)[0]
        for d in range(t.dim()):
            for size in (t.shape[d] + 1, t.shape[d] * 2, max(t.shape[d] - 1, 0)):
                shape = list(t.shape)
                shape[d] = size
                yield f"dim {d} = {size}", torch.zeros(shape, dtype=t.dtype)
        if t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1:
            yield "not contiguous", t.transpose(-1, -2).contiguous().transpose(-1, -2)
        elif t.numel() > 1:
            yield "not contiguous", torch.zeros(t.numel() * 2, dtype=t.dtype)[::2].view(t.shape)
    yield "on meta", t.to("meta")


def _fast_path_never_passes_what_the_checks_refuse(check, fast, name, args, monkeypatch):
    """For every one-property variant of every argument: where ``fast`` (the fast path)
    says the call is valid, ``check`` without the fast path must not raise."""
    assert fast(*args), "the valid form does not take the fast path"
    seen = 0
    for i, t in enumerate(args):
        if t is None:
            continue
        for what, variant in _variants(t):
            mutated = (*args[:i], variant, *args[i + 1:])
            if not fast(*mutated):
                continue
            seen += 1
            with monkeypatch.context() as m:
                m.setattr(_validate, name, lambda *a: False)
                try:
                    check(*mutated)
                except NVFP4InputError as exc:
                    raise AssertionError(f"the fast path passed argument {i} with {what}, "
                                         f"which the checks refuse: {exc}") from exc
    # the other accepted dtypes of the ids and the block scales take the fast path too
    assert seen, "no variant took the fast path: nothing was compared"


@pytest.mark.parametrize("per_row", [False, True, "mx"])
def test_moe_meta_fast_path_is_never_looser_than_the_checks(experts, per_row, monkeypatch):
    hidden = torch.zeros(T, H, dtype=torch.bfloat16)
    ids, weights = random_routing(T, E, K)
    ex = experts.args()
    if per_row:  # one global scale per row, as exact MXFP4 conversions have
        ex = (ex[0], ex[1], torch.ones(E, 2 * INTER), ex[3], ex[4], torch.ones(E, H))
    if per_row == "mx":  # MXFP4 in the kernels' form: UE8M0 scales per 32 k
        e8m0 = torch.float8_e8m0fnu
        ex = (ex[0], torch.zeros(E, 2 * INTER, H // 32, dtype=e8m0), ex[2], ex[3],
              torch.zeros(E, H, INTER // 32, dtype=e8m0), ex[5])
    args = (hidden, ids, weights, *ex)
    _fast_path_never_passes_what_the_checks_refuse(
        _validate.check_moe_meta, _validate._moe_meta_ok, "_moe_meta_ok", args, monkeypatch)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("per_row", [False, True])
def test_linear_meta_fast_path_is_never_looser_than_the_checks(bias, per_row, monkeypatch):
    n, k = 48, 64
    weight, scale, global_scale = random_nvfp4(n, k)
    if per_row:
        global_scale = torch.ones(n)
    args = (torch.zeros(3, k, dtype=torch.bfloat16), weight, scale, global_scale,
            torch.zeros(n, dtype=torch.bfloat16) if bias else None)
    _fast_path_never_passes_what_the_checks_refuse(
        _validate.check_linear_meta, _validate._linear_meta_ok, "_linear_meta_ok", args,
        monkeypatch)
