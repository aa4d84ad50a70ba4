"""The low-overhead Triton launcher (``nvfp4_ops.kernels.triton._launch``): its launch key
separates every case Triton compiles separately (CPU), and a direct launch computes what
``kernel[grid]`` computes, including for arguments that need another compiled variant
(GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nvfp4_ops.kernels.triton import _launch, moe_combine


def _fake_kernel(*params):
    """A stand-in with Triton's parameter flags: ``params`` are ``(is_constexpr,
    do_not_specialize)`` pairs."""
    return SimpleNamespace(params=[SimpleNamespace(is_constexpr=c, do_not_specialize=d)
                                   for c, d in params],
                           arg_names=[f"a{i}" for i in range(len(params))])


def test_key_separates_what_triton_specialises():
    launcher = _launch.Launcher(_fake_kernel((False, False), (False, False), (False, True),
                                             (True, False)))
    buf = torch.zeros(64, dtype=torch.float32)

    def key(t, n, m, c, **options):
        return launcher.key(0, (t, n, m, c), options)

    base = key(buf, 32, 5, 128)
    assert key(buf, 48, 7, 128) == base  # same dtype, alignment, %16, != 1; m unspecialised
    assert key(buf[1:], 32, 5, 128) != base  # pointer no longer 16-byte aligned
    assert key(buf[4:], 32, 5, 128) == base  # 16 bytes further: aligned again
    assert key(buf.view(torch.int32), 32, 5, 128) != base  # dtype
    assert key(buf, 33, 5, 128) != base  # not a multiple of 16
    assert key(buf, 1, 5, 128) != base  # the value 1
    assert key(buf, 2**40, 5, 128) != base  # i64, not i32
    assert key(buf, 32, 2**40, 128) != base  # an unspecialised int still has a type
    assert key(buf, 32, 5, 64) != base  # a constexpr
    assert key(buf, 32, 5, 128, num_warps=8) != base  # a launch option
    assert launcher.key(1, (buf, 32, 5, 128), {}) != base  # another device


def test_key_needs_every_parameter():
    launcher = _launch.Launcher(_fake_kernel((False, False), (True, False)))
    with pytest.raises(ValueError):
        launcher.key(0, (torch.zeros(4),), {})


def test_bound_launch_reuses_the_kernel_only_for_the_same_key_parts(monkeypatch):
    """A bound launch replaces its dynamic arguments and launches the compiled kernel
    directly (unchanged tensors as their addresses) while the new values' key parts (and the
    device) are those it was found for; anything else goes through the launcher with the
    tensors themselves (which compiles or finds the right variant)."""
    launcher = _launch.Launcher(_fake_kernel((False, False), (False, False), (False, False),
                                             (False, True), (True, False)))
    through, direct = [], []
    device = [0]

    def launch(grid, args, options):
        through.append(list(args))
        return "compiled"

    monkeypatch.setattr(launcher, "launch", launch)
    monkeypatch.setattr(_launch, "_run", lambda c, g, d, args: direct.append((c, d, args)))
    monkeypatch.setattr(_launch, "_hooks_installed", lambda: False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: device[0])
    buf = torch.zeros(64, dtype=torch.float32)
    other = torch.zeros(64, dtype=torch.float32)
    static = torch.zeros(8, dtype=torch.int32)
    bound = _launch.Launch(launcher, (1, 1, 1), (buf, static, 32, 5, 128), {}).bind("a0", "a3")
    bound(buf, 5)
    assert through == [[buf, static, 32, 5, 128]] and not direct
    bound(other, 7)  # same dtype, aligned, an unspecialised int of the same width
    assert len(through) == 1
    assert direct[-1] == ("compiled", 0, [other.data_ptr(), static.data_ptr(), 32, 7, 128])
    for t, m in [(buf[1:], 5),  # unaligned
                 (buf.view(torch.int32), 5),  # another dtype
                 (buf, 2**40)]:  # a wider int
        n = len(through)
        bound(t, m)
        assert len(through) == n + 1 and through[-1] == [t, static, 32, m, 128]
    n = len(direct)
    bound(buf, 2**40)  # the key of the last launch: direct again
    assert len(direct) == n + 1
    device[0] = 1
    bound(buf, 2**40)
    assert len(through) == 5 and len(direct) == n + 1
    monkeypatch.setattr(_launch, "_hooks_installed", lambda: True)
    bound(buf, 2**40)
    assert len(through) == 6, "a launch hook must see every launch"


def test_bound_launch_keeps_no_reference_to_the_values_it_was_built_with():
    import gc
    import weakref

    launcher = _launch.Launcher(_fake_kernel((False, False), (False, False)))
    first, static = torch.zeros(4), torch.zeros(4)
    seen = weakref.ref(first)
    bound = _launch.Launch(launcher, (1, 1, 1), (first, static), {}).bind("a0")
    del first
    gc.collect()
    assert seen() is None, "the bound launch kept the caller's input alive"
    assert bound._args[1] is static


def test_bind_takes_kernel_parameter_names():
    """The MoE binds its per-call values by parameter name; the names resolve to the
    positions the kernels take them at, and a wrong name is refused."""
    from nvfp4_ops.kernels.triton import moe_routing

    cases = [(moe_routing._fused_routing, ("topk_ids_ptr", "expert_start"), (0, 10)),
             (moe_routing._gather, ("hidden_ptr", "topk_weights_ptr"), (0, 1)),
             (moe_combine._combine, ("out_ptr", "output_scale"), (2, 3))]
    for launcher, names, positions in cases:
        args = tuple(range(len(launcher.kernel.arg_names)))
        assert _launch.Launch(launcher, (1, 1, 1), args, {}).bind(*names)._dynamic == positions
    with pytest.raises(ValueError, match="not a parameter"):
        _launch.Launch(moe_combine._combine, (1, 1, 1), (), {}).bind("y")


def test_interpreter_kernels_launch_through_triton(monkeypatch):
    """Without Triton's parameter objects (the interpreter) every call goes to
    ``kernel[grid]``."""
    calls = []

    class Interpreted:
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw))

    launcher = _launch.Launcher(Interpreted())
    launcher((1, 1, 1), torch.zeros(2), 3, num_warps=4)
    assert calls == [((1, 1, 1), calls[0][1], {"num_warps": 4})]


def test_no_hooks_means_direct_launches(monkeypatch):
    """An empty hook chain (newer Triton's default) is no hook; a callable or a chain with one
    is."""
    import triton

    runtime = triton.knobs.runtime
    monkeypatch.setattr(runtime, "launch_enter_hook", SimpleNamespace(calls=[]))
    monkeypatch.setattr(runtime, "launch_exit_hook", None)
    assert not _launch._hooks_installed()
    monkeypatch.setattr(runtime, "launch_exit_hook", SimpleNamespace(calls=[print]))
    assert _launch._hooks_installed()
    monkeypatch.setattr(runtime, "launch_exit_hook", print)
    assert _launch._hooks_installed()


def _combine_ref(y, slot_row, num_tokens, top_k, scale):
    rows = slot_row.long().reshape(num_tokens, top_k)
    vals = torch.where((rows >= 0)[..., None], y.float()[rows.clamp(min=0)], 0.0)
    return (vals.sum(1) * scale).to(torch.bfloat16)


@pytest.mark.gpu
def test_direct_launch_matches_triton_and_respecialises(monkeypatch):
    import triton

    through_triton = []
    run = triton.runtime.jit.JITFunction.run

    def counted(self, *args, **kwargs):
        through_triton.append(self.fn.__name__)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(triton.runtime.jit.JITFunction, "run", counted)
    torch.manual_seed(0)
    num_tokens, top_k, hidden = 5, 3, 256
    big = torch.randn(40 * hidden + 8, device="cuda").to(torch.bfloat16)
    slot_row = torch.randperm(40, device="cuda")[:num_tokens * top_k].to(torch.int32)
    slot_row[4] = -1
    launcher = moe_combine._combine
    before = len(launcher._compiled)
    for offset in (0, 0, 1, 1, 8, 8):  # elements: 0 and 8 are 16-byte aligned, 1 is not
        y = big[offset:offset + 40 * hidden].view(40, hidden)
        got = moe_combine.combine(y, slot_row, num_tokens, top_k, 1.5)
        torch.testing.assert_close(got, _combine_ref(y, slot_row, num_tokens, top_k, 1.5),
                                   rtol=0, atol=0)
    # the aligned and the unaligned pointer are two compiled variants, each reused: at most
    # their first launches went through Triton
    assert len(launcher._compiled) - before <= 2
    assert len(through_triton) <= 2, through_triton
    keys = [k for k in launcher._compiled if k[2][0][0] is torch.bfloat16]
    assert {k[2][0][1] for k in keys} == {True, False}


@pytest.mark.gpu
def test_launch_hooks_bypass_the_direct_path(monkeypatch):
    """With a launch hook installed (profilers), launches go through Triton, which calls it."""
    import triton

    seen = []
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", seen.append)
    y = torch.randn(8, 128, device="cuda").to(torch.bfloat16)
    slot_row = torch.arange(8, device="cuda", dtype=torch.int32)
    for _ in range(2):
        moe_combine.combine(y, slot_row, 4, 2, 1.0)
    torch.cuda.synchronize()
    assert len(seen) == 2
