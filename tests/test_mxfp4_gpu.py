"""MXFP4 weights (DeepSeek's routed-expert format) on the GPU: the conversion
``nvfp4::mxfp4_to_nvfp4`` on CUDA tensors equals the CPU conversion bitwise, and ``nvfp4::moe``
on the converted weights (one global scale per row) matches an independent reference computed
from the MXFP4 tensors: V4-Flash and V4-Pro H/I with few experts, several T, EP with
``expert_start > 0``, the ``wperm`` order, CUDA-graph replay with new routing, torch.compile.
The kernels' native form (``nvfp4::mxfp4_kernel_scales``: UE8M0 scales read by the ``mx``
kernel variants) gives bitwise the converted form's result at every token tile, and the same
checks hold on it.

Every MoE test runs the real CUDA path: the module fixture checks that the op dispatches to
``moe_cuda`` (as tests/test_moe_gpu.py does).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import nvfp4_ops
from nvfp4_ops import format as fmt
from nvfp4_ops.testing import assert_moe_close, capture_graph, random_routing

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_moe_kernel")]

FLASH = nvfp4_ops.get_shape("v4-flash")
PRO = nvfp4_ops.get_shape("v4-pro")
NUM_EXPERTS = 8  # few experts, the real H and I


@dataclass
class Mxfp4Experts:
    """MXFP4 experts (as vLLM's Mxfp4MoEMethod holds them) and their exact NVFP4 form."""

    w13: torch.Tensor  # uint8 [E, 2I, H/2]
    s13: torch.Tensor  # uint8 e8m0 [E, 2I, H/32]
    w2: torch.Tensor  # uint8 [E, H, I/2]
    s2: torch.Tensor  # uint8 e8m0 [E, H, I/32]
    b13: torch.Tensor | None = None  # e4m3 [E, 2I, H/16]
    g13: torch.Tensor | None = None  # fp32 [E, 2I]
    b2: torch.Tensor | None = None  # e4m3 [E, H, I/16]
    g2: torch.Tensor | None = None  # fp32 [E, H]
    n13: torch.Tensor | None = None  # the kernels' UE8M0 form, float8_e8m0fnu [E, 2I, H/32]
    n2: torch.Tensor | None = None  # float8_e8m0fnu [E, H, I/32] (same global scales)

    def args(self, w13=None, w2=None, native=False) -> tuple[torch.Tensor, ...]:
        s13, s2 = (self.n13, self.n2) if native else (self.b13, self.b2)
        return (self.w13 if w13 is None else w13, s13, self.g13,
                self.w2 if w2 is None else w2, s2, self.g2)


def _mx_proj(rows, k, std, gen, row_binades=10, block_binades=6):
    """Gaussian weights times 2^-r per row and 2^-b per 32-block, quantized to MXFP4 on the
    GPU: the block exponents of one tensor spread over ~16+ binades, <= 18 within a row."""
    w = torch.randn(rows, k, device="cuda", generator=gen) * std
    r = torch.randint(0, row_binades, (rows, 1, 1), device="cuda", generator=gen)
    b = torch.randint(0, block_binades, (rows, k // 32, 1), device="cuda", generator=gen)
    w = (w.view(rows, k // 32, 32) * torch.exp2(-(r + b).float())).view(rows, k)
    return fmt.mxfp4_quantize(w)


def _mx_experts(shape, seed, num_experts=NUM_EXPERTS) -> Mxfp4Experts:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    hidden, inter = shape.hidden, shape.intermediate
    w13 = torch.empty(num_experts, 2 * inter, hidden // 2, dtype=torch.uint8, device="cuda")
    s13 = torch.empty(num_experts, 2 * inter, hidden // 32, dtype=torch.uint8, device="cuda")
    w2 = torch.empty(num_experts, hidden, inter // 2, dtype=torch.uint8, device="cuda")
    s2 = torch.empty(num_experts, hidden, inter // 32, dtype=torch.uint8, device="cuda")
    for e in range(num_experts):
        w13[e, :inter], s13[e, :inter] = _mx_proj(inter, hidden, 0.02, gen)
        w13[e, inter:], s13[e, inter:] = _mx_proj(inter, hidden, 0.05, gen)
        w2[e], s2[e] = _mx_proj(hidden, inter, 0.02, gen)
    mx = Mxfp4Experts(w13, s13, w2, s2)
    mx.b13, mx.g13 = nvfp4_ops.mxfp4_to_nvfp4(w13, s13, name="w13")
    mx.b2, mx.g2 = nvfp4_ops.mxfp4_to_nvfp4(w2, s2, name="w2")
    mx.n13, g13 = nvfp4_ops.mxfp4_kernel_scales(w13, s13, name="w13")
    mx.n2, g2 = nvfp4_ops.mxfp4_kernel_scales(w2, s2, name="w2")
    assert torch.equal(g13, mx.g13) and torch.equal(g2, mx.g2)  # one rule for both forms
    return mx


@pytest.fixture(scope="module")
def flash():
    return _mx_experts(FLASH, 0)


@pytest.fixture(scope="module")
def pro():
    return _mx_experts(PRO, 1)


def _shape_and_experts(name, flash, pro):
    return (FLASH, flash) if name == "v4-flash" else (PRO, pro)


def _poison_allocator(nbytes: int) -> None:
    """NaN-fill the caching allocator's free blocks, so an output row the kernels forget to
    write shows up as NaN."""
    junk = torch.full((nbytes // 4,), float("nan"), device="cuda")
    del junk


def _hidden(num_tokens, hidden_size):
    return torch.randn(num_tokens, hidden_size, device="cuda").to(torch.bfloat16)


def _reference(hidden, ids, weights, mx: Mxfp4Experts, expert_start, limit, output_scale):
    """Independent of the conversion: each touched expert dequantized from its MXFP4 tensors
    (``format.mxfp4_dequantize``) to fp32, fp32 matmuls, clamped SwiGLU in fp32 rounded to bf16
    (where the op's contract rounds), the k weighted outputs summed in fp32, one bf16 round."""
    num_tokens, top_k = ids.shape
    inter = mx.w13.shape[1] // 2
    acc = torch.zeros(num_tokens, top_k, hidden.shape[1], device="cuda")
    local = ids.long() - expert_start
    for e in range(mx.w13.shape[0]):
        tok, slot = torch.nonzero(local == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        gate_up = hidden[tok].float() @ fmt.mxfp4_dequantize(mx.w13[e], mx.s13[e]).T
        gate, up = gate_up[:, :inter], gate_up[:, inter:]
        if limit is not None:
            gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        act = (gate * torch.sigmoid(gate) * up).to(torch.bfloat16)
        y = act.float() @ fmt.mxfp4_dequantize(mx.w2[e], mx.s2[e]).T
        acc[tok, slot] = y * weights[tok, slot].float().unsqueeze(-1)
    return (acc.sum(dim=1) * output_scale).to(torch.bfloat16)


# ---------------------------------------------------------------- the conversion on CUDA


@pytest.mark.parametrize("shape_name", ["v4-flash", "v4-pro"])
def test_cuda_conversion_equals_cpu_bitwise(flash, pro, shape_name):
    """Same bytes from the CUDA and the CPU conversion (V4-Pro's w2 takes several chunks), and
    the converted weights dequantize bitwise to the MXFP4 ones on the GPU too."""
    _, mx = _shape_and_experts(shape_name, flash, pro)
    for codes, scale, block, glob in ((mx.w13, mx.s13, mx.b13, mx.g13),
                                      (mx.w2, mx.s2, mx.b2, mx.g2)):
        assert block.is_cuda and glob.is_cuda
        cpu_block, cpu_glob = nvfp4_ops.mxfp4_to_nvfp4(codes.cpu(), scale.cpu())
        assert torch.equal(block.view(torch.uint8).cpu(), cpu_block.view(torch.uint8))
        assert torch.equal(glob.cpu(), cpu_glob)
        for e in (0, codes.shape[0] - 1):
            assert torch.equal(fmt.dequantize(codes[e], block[e], glob[e]),
                               fmt.mxfp4_dequantize(codes[e], scale[e]))
    e = mx.s13.int() - 127
    assert int(e.max() - e.min()) >= 15  # a wide spread across one tensor ...
    assert mx.g13[:, :mx.w13.shape[1] // 2].unique().numel() > 2  # ... needing per-row scales


def test_cuda_conversion_refusals_match_cpu(flash):
    codes, scale = flash.w2[:2].clone(), flash.s2[:2].clone()
    scale[1, 5, 3] = 0xFF
    with pytest.raises(nvfp4_ops.NVFP4InputError, match=r"w2: .*scale\[1, 5, 3\] is 0xFF"):
        nvfp4_ops.mxfp4_to_nvfp4(codes, scale, name="w2")
    scale = flash.s2[:2].clone()
    scale[0, 9] = 127
    scale[0, 9, 2] = 127 - 18
    codes[0, 9, 32:48] |= 0x11  # block 2 holds non-zero codes
    messages = []
    for device in ("cuda", "cpu"):
        with pytest.raises(nvfp4_ops.NVFP4InputError) as info:
            nvfp4_ops.mxfp4_to_nvfp4(codes.to(device), scale.to(device), name="w2")
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "row [0, 9]" in messages[0]
    assert "block 2" in messages[0]
    torch.cuda.synchronize()


# ---------------------------------------------------------------- the MoE on converted weights


def _run(shape, mx, hidden, ids, weights, expert_start=0, output_scale=1.5, **kw):
    _poison_allocator(8 * (hidden.shape[0] * shape.top_k + 64 * mx.w13.shape[0])
                      * (shape.hidden + shape.intermediate) + 2**20)
    got = nvfp4_ops.moe(hidden, ids, weights, *mx.args(), expert_start=expert_start,
                        swiglu_limit=shape.swiglu_limit, output_scale=output_scale, **kw)
    want = _reference(hidden, ids, weights, mx, expert_start, shape.swiglu_limit, output_scale)
    return got, want


@pytest.mark.parametrize("num_tokens", [1, 8, 199, 1024])
@pytest.mark.parametrize("shape_name", ["v4-flash", "v4-pro"])
def test_moe_on_converted_weights_matches_reference(flash, pro, shape_name, num_tokens):
    shape, mx = _shape_and_experts(shape_name, flash, pro)
    torch.manual_seed(10 + num_tokens)
    hidden = _hidden(num_tokens, shape.hidden)
    ids, weights = random_routing(num_tokens, NUM_EXPERTS, shape.top_k, device="cuda")
    got, want = _run(shape, mx, hidden, ids, weights)
    assert_moe_close(got, want, f"{shape_name} T={num_tokens}")


@pytest.mark.parametrize("num_tokens", [1, 37, 1024])
@pytest.mark.parametrize("shape_name", ["v4-flash", "v4-pro"])
def test_wperm_codes_give_bitwise_the_same_result(flash, pro, shape_name, num_tokens):
    """The glue's CUDA preparation: codes permuted in place after the conversion
    (``to_wperm_``), op called with ``wperm=True``: bitwise the checkpoint-order result."""
    shape, mx = _shape_and_experts(shape_name, flash, pro)
    assert nvfp4_ops.prepare.moe_wperm_supported(shape.hidden, shape.intermediate)
    w13, w2 = mx.w13.clone(), mx.w2.clone()
    nvfp4_ops.to_wperm_(w13)
    nvfp4_ops.to_wperm_(w2)
    torch.manual_seed(20 + num_tokens)
    hidden = _hidden(num_tokens, shape.hidden)
    ids, weights = random_routing(num_tokens, NUM_EXPERTS, shape.top_k, device="cuda")
    kw = dict(swiglu_limit=shape.swiglu_limit, output_scale=1.5)
    want = nvfp4_ops.moe(hidden, ids, weights, *mx.args(), **kw)
    _poison_allocator(2**28)
    got = nvfp4_ops.moe(hidden, ids, weights, *mx.args(w13, w2), wperm=True, **kw)
    assert torch.equal(got, want)


@pytest.mark.parametrize("num_tokens", [1, 199])
@pytest.mark.parametrize("shape_name", ["v4-flash", "v4-pro"])
def test_expert_parallel_slice(flash, pro, shape_name, num_tokens):
    """This rank owns global experts [16, 24) of 32: other ids contribute nothing, a token with
    no local expert gets exactly 0."""
    shape, mx = _shape_and_experts(shape_name, flash, pro)
    start, total = 16, 32
    torch.manual_seed(30 + num_tokens)
    hidden = _hidden(num_tokens, shape.hidden)
    ids, weights = random_routing(num_tokens, total, shape.top_k, device="cuda")
    ids[0] = torch.tensor([0, 1, 2, 3, 30, 31], device="cuda", dtype=ids.dtype)
    if num_tokens > 1:
        ids[1] = torch.tensor([16, 17, 18, 19, 20, 23], device="cuda", dtype=ids.dtype)
    got, want = _run(shape, mx, hidden, ids, weights, expert_start=start,
                     global_num_experts=total)
    assert torch.equal(got[0], torch.zeros_like(got[0])), "token with no local expert"
    assert_moe_close(got, want, f"{shape_name} EP start={start} T={num_tokens}")


@pytest.mark.parametrize("native", [False, True], ids=["converted", "native"])
@pytest.mark.parametrize("num_tokens", [8, 37, 100])
def test_cuda_graph_replay_with_new_routing(flash, num_tokens, native):
    """Captured once on the converted weights, or on the kernels' UE8M0 form (``native``;
    warmed from the layer first), with the codes in the wperm order as the glue prepares them
    on CUDA; replayed with new hidden states and new routing copied into the static buffers:
    each replay equals the eager op (and, native, the eager op on the converted form) and the
    reference, and changes from the previous one."""
    nvfp4_ops.warmup(layers=[nvfp4_ops.MoELayer(NUM_EXPERTS, FLASH.hidden, FLASH.intermediate,
                                                FLASH.top_k, wperm=True, mx=native)])
    w13, w2 = flash.w13.clone(), flash.w2.clone()
    nvfp4_ops.to_wperm_(w13)
    nvfp4_ops.to_wperm_(w2)
    args = flash.args(w13, w2, native=native)
    torch.manual_seed(40 + num_tokens)
    hidden = _hidden(num_tokens, FLASH.hidden)
    ids, weights = random_routing(num_tokens, NUM_EXPERTS, FLASH.top_k, device="cuda")

    def call():
        return nvfp4_ops.moe(hidden, ids, weights, *args, swiglu_limit=FLASH.swiglu_limit,
                             output_scale=1.5, wperm=True)

    # compiles / loads every kernel of this tile before capture
    graph, static_out = capture_graph(call, warm_calls=2)
    previous = None
    for step in range(4):
        new_ids, new_weights = random_routing(num_tokens, NUM_EXPERTS, FLASH.top_k,
                                              device="cuda")
        if step == 3:  # skewed: every slot to two experts
            new_ids[:, :] = torch.tensor([3, 4] * (FLASH.top_k // 2), device="cuda",
                                         dtype=new_ids.dtype)
        hidden.copy_(_hidden(num_tokens, FLASH.hidden))
        ids.copy_(new_ids)
        weights.copy_(new_weights)
        static_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = call()
        assert torch.equal(static_out, eager), f"replay {step} != eager"
        if native:
            converted = nvfp4_ops.moe(hidden, ids, weights, *flash.args(w13, w2),
                                      swiglu_limit=FLASH.swiglu_limit, output_scale=1.5,
                                      wperm=True)
            assert torch.equal(static_out, converted), f"replay {step} != converted form"
        if previous is not None:
            assert not torch.equal(static_out, previous), "replay output did not change"
        previous = static_out.clone()
        want = _reference(hidden, ids, weights, flash, 0, FLASH.swiglu_limit, 1.5)
        assert_moe_close(static_out, want, f"graph replay {step}")


@pytest.mark.parametrize("native", [False, True], ids=["converted", "native"])
def test_torch_compile_fullgraph_matches_eager(flash, native):
    """torch.compile(fullgraph=True) of a layer calling the op on the converted weights (or the
    kernels' UE8M0 form), with a dynamic token count, bitwise equal to eager."""
    torch._dynamo.reset()
    args = flash.args(native=native)

    def layer(hidden, ids, weights):
        return nvfp4_ops.moe(hidden, ids, weights, *args, swiglu_limit=FLASH.swiglu_limit,
                             output_scale=1.5)

    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for num_tokens in (5, 37, 1, 130):
        torch.manual_seed(50 + num_tokens)
        hidden = _hidden(num_tokens, FLASH.hidden)
        ids, weights = random_routing(num_tokens, NUM_EXPERTS, FLASH.top_k, device="cuda")
        for t in (hidden, ids, weights):
            torch._dynamo.mark_dynamic(t, 0)
        assert torch.equal(compiled(hidden, ids, weights), layer(hidden, ids, weights)), (
            f"T={num_tokens}")


def test_opcheck_conversion_cuda(flash):
    torch.library.opcheck(torch.ops.nvfp4.mxfp4_to_nvfp4.default,
                          (flash.w2[:2].contiguous(), flash.s2[:2].contiguous()))


# ---------------------------------------------------------------- the kernels' UE8M0 form


@pytest.mark.parametrize("shape_name", ["v4-flash", "v4-pro"])
def test_native_scales_cuda_equal_cpu_bitwise(flash, pro, shape_name):
    _, mx = _shape_and_experts(shape_name, flash, pro)
    for codes, scale, native in ((mx.w13, mx.s13, mx.n13), (mx.w2, mx.s2, mx.n2)):
        cpu_native, _ = nvfp4_ops.mxfp4_kernel_scales(codes.cpu(), scale.cpu())
        assert native.is_cuda and native.dtype == torch.float8_e8m0fnu
        assert torch.equal(native.view(torch.uint8).cpu(), cpu_native.view(torch.uint8))


#: token counts that reach every tile class at 8 experts (streamed 8 persistent and not,
#: WGMMA 16-64, 128 with four row warpgroups, 256), checked in the test
NATIVE_TOKENS = [1, 4, 8, 20, 37, 100, 199]


@pytest.mark.parametrize("routing", ["uniform", "skew"])
@pytest.mark.parametrize("shape_name", ["v4-flash", "v4-pro"])
def test_native_moe_is_bitwise_the_converted_result(flash, pro, shape_name, routing):
    """The ``mx`` kernels on UE8M0 scales (wperm codes, as the glue prepares them) against the
    NVFP4 kernels on the converted scales: the same bf16 weights reach the same MMAs in the
    same order, so every T gives bitwise the same output; one T also against the reference."""
    from nvfp4_ops.kernels import dispatch

    shape, mx = _shape_and_experts(shape_name, flash, pro)
    w13, w2 = mx.w13.clone(), mx.w2.clone()
    nvfp4_ops.to_wperm_(w13)
    nvfp4_ops.to_wperm_(w2)
    tiles = set()
    for num_tokens in NATIVE_TOKENS:
        plan = dispatch.plan_moe(num_tokens, shape.top_k, NUM_EXPERTS, shape.hidden,
                                 shape.intermediate, order=dispatch.WeightOrder.WPERM, mx=True)
        tiles.add(plan.block_m)
        torch.manual_seed(60 + num_tokens)
        hidden = _hidden(num_tokens, shape.hidden)
        ids, weights = random_routing(num_tokens, NUM_EXPERTS, shape.top_k, device="cuda")
        if routing == "skew":  # two thirds of the tokens on experts 2 and 5 (hot tiles)
            hot = torch.tensor([2, 5], device="cuda")
            others = torch.tensor([0, 1, 3, 4, 6, 7], device="cuda")
            for row in range(2 * num_tokens // 3 + 1):
                pick = others[torch.randperm(6, device="cuda")[: shape.top_k - 2]]
                ids[row] = torch.cat([hot, pick]).to(ids.dtype)
        kw = dict(swiglu_limit=shape.swiglu_limit, output_scale=1.5, wperm=True)
        want = nvfp4_ops.moe(hidden, ids, weights, *mx.args(w13, w2), **kw)
        _poison_allocator(2**28)
        got = nvfp4_ops.moe(hidden, ids, weights, *mx.args(w13, w2, native=True), **kw)
        assert torch.equal(got, want), f"{shape_name} {routing} T={num_tokens}"
        if num_tokens == 37:
            ref = _reference(hidden, ids, weights, mx, 0, shape.swiglu_limit, 1.5)
            assert_moe_close(got, ref, f"native {shape_name} {routing} T={num_tokens}")
    assert {8, 16, 64, 128, 256} <= tiles, tiles


@pytest.mark.parametrize("num_tokens", [1, 199])
def test_native_expert_parallel_slice(pro, num_tokens):
    start, total = 16, 32
    torch.manual_seed(70 + num_tokens)
    hidden = _hidden(num_tokens, PRO.hidden)
    ids, weights = random_routing(num_tokens, total, PRO.top_k, device="cuda")
    ids[0] = torch.tensor([0, 1, 2, 3, 30, 31], device="cuda", dtype=ids.dtype)
    kw = dict(expert_start=start, global_num_experts=total, swiglu_limit=PRO.swiglu_limit,
              output_scale=1.5)
    got = nvfp4_ops.moe(hidden, ids, weights, *pro.args(native=True), **kw)
    want = nvfp4_ops.moe(hidden, ids, weights, *pro.args(), **kw)
    assert torch.equal(got, want)
    assert torch.equal(got[0], torch.zeros_like(got[0])), "token with no local expert"


@pytest.mark.parametrize("routing", ["uniform", "local"])
@pytest.mark.parametrize("shape_name", ["v4-flash", "v4-pro"])
def test_native_capped_down_tiles(flash, pro, shape_name, routing):
    """One rank of 8 local experts of 256 at T = 128: the ``mx`` down GEMM walks its token
    tiles with persistent CTAs capped at ``dispatch.DOWN_TILES_CAP`` per feature tile, as the
    NVFP4 one does. Bitwise the same plan with one CTA per grid item and the converted
    weights' result, and close to the reference; ``local``: every slot on this rank's experts
    (more real tiles than the cap, so CTAs walk several)."""
    from nvfp4_ops.kernels import dispatch, moe_cuda
    from nvfp4_ops.testing import with_config_fields

    shape, mx = _shape_and_experts(shape_name, flash, pro)
    num_tokens, start, total = 128, 128, 256
    w13, w2 = mx.w13.clone(), mx.w2.clone()
    nvfp4_ops.to_wperm_(w13)
    nvfp4_ops.to_wperm_(w2)
    plan = dispatch.plan_moe(num_tokens, shape.top_k, NUM_EXPERTS, shape.hidden,
                             shape.intermediate, global_num_experts=total,
                             order=dispatch.WeightOrder.WPERM, mx=True)
    assert plan.down.family == "stream" and plan.down.config.mx, plan.down
    assert plan.down.config.ctas == shape.hidden // 16 * dispatch.DOWN_TILES_CAP, plan.down
    one_per_item = with_config_fields(plan, {"ctas": 0}, where={"epilogue": "row_scale"})
    torch.manual_seed(80)
    hidden = _hidden(num_tokens, shape.hidden)
    if routing == "local":  # every slot on this rank's experts
        ids, weights = random_routing(num_tokens, NUM_EXPERTS, shape.top_k, device="cuda",
                                      expert_start=start)
    else:
        ids, weights = random_routing(num_tokens, total, shape.top_k, device="cuda")
    native = mx.args(w13, w2, native=True)
    got = moe_cuda.moe_forward(hidden, ids, weights, *native, start, shape.swiglu_limit, 1.5,
                               plan=plan)
    assert torch.equal(got, moe_cuda.moe_forward(hidden, ids, weights, *native, start,
                                                 shape.swiglu_limit, 1.5, plan=one_per_item))
    converted = nvfp4_ops.moe(hidden, ids, weights, *mx.args(w13, w2), expert_start=start,
                              global_num_experts=total, swiglu_limit=shape.swiglu_limit,
                              output_scale=1.5, wperm=True)
    assert torch.equal(got, converted)
    ref = _reference(hidden, ids, weights, mx, start, shape.swiglu_limit, 1.5)
    assert_moe_close(got, ref, f"native capped {shape_name} {routing}")


def _assert_grouped_form(mx: Mxfp4Experts, s13, g13, s2, g2) -> None:
    """The prepared native form is the per-row rebase (bitwise the CPU's, tested above) with
    one global scale per expert half (``format.mxfp4_group_globals``)."""
    want13 = fmt.mxfp4_group_globals(mx.w13, mx.n13, mx.g13, 2)
    want2 = fmt.mxfp4_group_globals(mx.w2, mx.n2, mx.g2, 1)
    assert want13 is not None and want2 is not None
    assert torch.equal(s13.view(torch.uint8), want13[0].view(torch.uint8))
    assert torch.equal(s2.view(torch.uint8), want2[0].view(torch.uint8))
    assert torch.equal(g13, want13[1]) and torch.equal(g2, want2[1].squeeze(-1))


def test_prepare_native_on_cuda(flash):
    """``prepare_mxfp4_moe(native=True)`` on CUDA tensors (what the glue does with
    ``NVFP4_OPS_MXFP4_SCALES=native``): the kernels' UE8M0 form (bitwise the CPU rebase) with
    one global scale per expert half, the codes permuted in place, and bitwise the converted
    form's MoE output; sizes whose kernels
    cannot read MXFP4 scales are refused before anything is modified."""
    w13, w2 = flash.w13.clone(), flash.w2.clone()
    s13, g13, s2, g2, wperm = nvfp4_ops.prepare_mxfp4_moe(w13, flash.s13, w2, flash.s2,
                                                          native=True, where="layer 3")
    assert wperm and s13.dtype == torch.float8_e8m0fnu
    _assert_grouped_form(flash, s13, g13, s2, g2)
    assert not torch.equal(w13, flash.w13)  # permuted in place
    torch.manual_seed(95)
    hidden = _hidden(37, FLASH.hidden)
    ids, weights = random_routing(37, NUM_EXPERTS, FLASH.top_k, device="cuda")
    kw = dict(swiglu_limit=FLASH.swiglu_limit, output_scale=1.5, wperm=True)
    got = nvfp4_ops.moe(hidden, ids, weights, w13, s13, g13, w2, s2, g2, **kw)
    assert torch.equal(got, nvfp4_ops.moe(hidden, ids, weights, *flash.args(w13, w2), **kw))
    codes = torch.zeros(2, 256, 128, dtype=torch.uint8, device="cuda")  # H = 256, I = 128
    scale = torch.full((2, 256, 8), 127, dtype=torch.uint8, device="cuda")
    down = torch.zeros(2, 256, 64, dtype=torch.uint8, device="cuda")
    before = codes.clone()
    with pytest.raises(nvfp4_ops.NVFP4InputError,
                       match=r"layer 3: native MXFP4 scales at H=256, I=128 have no kernel"):
        nvfp4_ops.prepare_mxfp4_moe(codes, scale, down, torch.full(
            (2, 256, 4), 127, dtype=torch.uint8, device="cuda"), native=True, where="layer 3")
    assert torch.equal(codes, before)


def test_prepare_auto_on_cuda(flash, monkeypatch):
    """``NVFP4_OPS_MXFP4_SCALES`` unset (``auto``, what the glue runs): CUDA tensors at sizes
    the ``mx`` kernels read keep UE8M0 scales (bitwise ``native=True``'s form); sizes they do
    not read are converted to NVFP4's scales instead of refused."""
    monkeypatch.delenv("NVFP4_OPS_MXFP4_SCALES", raising=False)
    w13, w2 = flash.w13.clone(), flash.w2.clone()
    s13, g13, s2, g2, wperm = nvfp4_ops.prepare_mxfp4_moe(w13, flash.s13, w2, flash.s2)
    assert wperm and s13.dtype == s2.dtype == torch.float8_e8m0fnu
    _assert_grouped_form(flash, s13, g13, s2, g2)
    codes = torch.full((2, 256, 128), 0x21, dtype=torch.uint8, device="cuda")  # H = 256, I = 128
    down = torch.full((2, 256, 64), 0x21, dtype=torch.uint8, device="cuda")
    scale13 = torch.full((2, 256, 8), 127, dtype=torch.uint8, device="cuda")
    scale2 = torch.full((2, 256, 4), 127, dtype=torch.uint8, device="cuda")
    s13, _, s2, _, _ = nvfp4_ops.prepare_mxfp4_moe(codes, scale13, down, scale2)
    assert s13.dtype == s2.dtype == torch.float8_e4m3fn
    assert s13.shape == (2, 256, 16) and s2.shape == (2, 256, 8)
