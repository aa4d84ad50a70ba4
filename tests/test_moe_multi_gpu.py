"""``nvfp4::moe`` under real expert parallelism: two processes, one GPU each, NCCL.

Rank ``r`` owns the experts ``[r E/2, (r+1) E/2)`` of a V4-Flash or V4-Pro layer (real H, I
and E; one layer) and gets the same tokens and the same global ``topk_ids`` as the other
rank; it runs ``nvfp4_ops.moe`` with its ``expert_start`` and ``global_num_experts = E``. The
fp32 sum of the two bf16 outputs (an all-reduce) must equal the single-GPU op over all experts
(rank 0 holds them too), eagerly and from a CUDA graph per rank replayed with new routing
copied into its static buffers (``nvfp4_ops.warmup`` per rank before capture).

Bounds, stated honestly: each rank rounds its partial sum to bf16 (relative error <= 2^-9 per
element), the single-GPU result is rounded once, and the two runs may tile the grouped GEMMs
differently (the tile follows the mean rows per *local* expert), which reorders fp32 sums and
can move a slot's bf16 output by one ulp. That is well under the 4e-3 relative L2 that the
single-GPU tests allow against the reference (per-slot bf16 rounding), and each partial must
also match the reference of its own expert slice within that bound. Exact: a token whose
experts all live on the other rank gives exactly 0 on this one, and a graph replay gives
bitwise the eager output of the same inputs.

Every process keeps NVLink multicast off (``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``; nothing calls
``cuMulticastCreate``). A child's failure fails the test with the child's traceback. Cold
kernel caches make each rank compile its variants first: run
``python -m nvfp4_ops precompile --shape v4-flash --shape v4-pro --jobs 8`` before.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]

WORLD = 2
SEED = 123
NUM_TOKENS = 96


def _devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


requires_two_gpus = pytest.mark.skipif(
    _devices() < WORLD, reason=f"needs {WORLD} CUDA devices (found {_devices()}): expert "
                               "parallelism over NCCL, one process per GPU")


def _routing(shape, num_tokens: int, seed: int, device) -> tuple[torch.Tensor, ...]:
    """The same global routing on every rank (drawn on the CPU from ``seed``), with token 0
    routed only to rank 0's experts and token 1 only to rank 1's."""
    from nvfp4_ops.testing import uniform_routing

    ids, weights = uniform_routing(num_tokens, shape.experts, shape.top_k, seed=seed)
    half = shape.experts // WORLD
    gen = torch.Generator().manual_seed(seed + 1)
    for token, rank in ((0, 0), (1, 1)):
        ids[token] = torch.randperm(half, generator=gen)[:shape.top_k].to(ids.dtype) + rank * half
    hidden = torch.randn(num_tokens, shape.hidden, generator=gen).to(torch.bfloat16)
    return hidden.to(device), ids.to(device), weights.to(device)


def _digest(tensors) -> torch.Tensor:
    """Two byte sums per tensor (all bytes; every 7th byte): equal bytes give equal digests."""
    out = []
    for t in tensors:
        raw = t.contiguous().view(torch.uint8).reshape(-1)
        out += [raw.sum(dtype=torch.int64), raw[::7].sum(dtype=torch.int64)]
    return torch.stack(out)


def _check_sum(total: torch.Tensor, want: torch.Tensor, what: str) -> None:
    from nvfp4_ops.testing import MOE_REL_L2, rel_l2

    assert not total.isnan().any(), f"{what}: NaN"
    err = rel_l2(total, want)
    assert err < MOE_REL_L2, f"{what}: all-reduced partials vs the single-GPU op, rel L2 {err:.2e}"
    tol = 0.02 * want.float().abs().max().item() + 1e-3
    max_err = (total - want.float()).abs().max().item()
    assert max_err < tol, f"{what}: max abs error {max_err:.3e} (tolerance {tol:.3e})"


def _rank(rank: int, shape_name: str, rendezvous: str) -> None:
    """One process: its GPU, its experts, its checks; raises on any mismatch."""
    import torch.distributed as dist

    import nvfp4_ops
    from nvfp4_ops.kernels import dispatch
    from nvfp4_ops.reference import moe_reference
    from nvfp4_ops.testing import (
        MOE_REL_L2,
        capture_graph,
        fast_random_experts,
        init_nccl_rank,
        rel_l2,
    )

    device = init_nccl_rank(rank, WORLD, rendezvous)
    try:
        shape = nvfp4_ops.get_shape(shape_name)
        e, h, i = shape.experts, shape.hidden, shape.intermediate
        local = e // WORLD
        start = rank * local
        kw = {"device": device, "seed": SEED}
        full = fast_random_experts(e, h, i, **kw) if rank == 0 else None
        mine = fast_random_experts(local, h, i, first_expert=start, **kw)
        # both ranks hold the same bytes for the same expert (rank 0 checks rank 1's slice)
        digests = [torch.empty(12, dtype=torch.int64, device=device) for _ in range(WORLD)]
        dist.all_gather(digests, _digest(mine.args()))
        if rank == 0:
            other = _digest([t[local:] for t in full.args()])
            assert torch.equal(digests[1], other), "rank 1's experts differ from rank 0's"
        wperm = dispatch.moe_wperm_supported(h, i)
        if wperm:
            for q in (mine, full) if full is not None else (mine,):
                nvfp4_ops.to_wperm_(q.w13)
                nvfp4_ops.to_wperm_(q.w2)
        nvfp4_ops.warmup([shape_name])
        op = {"swiglu_limit": shape.swiglu_limit, "global_num_experts": e, "wperm": wperm}

        def partial(hidden, ids, weights):
            return nvfp4_ops.moe(hidden, ids, weights, *mine.args(), expert_start=start, **op)

        def check(part, hidden, ids, weights, what):
            other_token = 1 - rank
            assert torch.equal(part[other_token], torch.zeros_like(part[other_token])), (
                f"{what}: token {other_token} has no expert on rank {rank} but got a non-zero "
                "output")
            assert part[rank].abs().max() > 0, f"{what}: token {rank} (all experts local) is 0"
            ref = moe_reference(hidden, ids, weights, *mine.args(), start, shape.swiglu_limit,
                                1.0, wperm=wperm)
            err = rel_l2(part, ref)
            assert err < MOE_REL_L2, f"{what}: rank {rank}'s partial vs its reference {err:.2e}"
            total = part.float()
            dist.all_reduce(total)
            parts = [torch.empty_like(part) for _ in range(WORLD)]
            dist.all_gather(parts, part)
            assert torch.equal(total, parts[0].float() + parts[1].float()), f"{what}: all-reduce"
            if rank == 0:
                want = nvfp4_ops.moe(hidden, ids, weights, *full.args(), **op)
                _check_sum(total, want, what)

        # eager
        hidden, ids, weights = _routing(shape, NUM_TOKENS, SEED, device)
        check(partial(hidden, ids, weights), hidden, ids, weights, "eager")

        # one CUDA graph per rank, replayed with new routing copied into its static buffers
        graph, static_out = capture_graph(lambda: partial(hidden, ids, weights))
        previous = None
        for step in range(3):
            new = _routing(shape, NUM_TOKENS, SEED + 10 * (step + 1), device)
            for buf, value in zip((hidden, ids, weights), new, strict=True):
                buf.copy_(value)
            graph.replay()
            eager = partial(hidden, ids, weights)
            assert torch.equal(static_out, eager), f"replay {step} != eager on rank {rank}"
            if previous is not None:
                assert not torch.equal(static_out, previous), "replay output did not change"
            previous = static_out.clone()
            check(static_out, hidden, ids, weights, f"graph replay {step}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@requires_two_gpus
@pytest.mark.parametrize("shape_name", ["v4-flash", "v4-pro"])
def test_two_ranks_sum_to_the_single_gpu_op(shape_name, tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    from nvfp4_ops.testing import MULTICAST_OFF

    for key, value in MULTICAST_OFF.items():
        monkeypatch.setenv(key, value)  # inherited by the children, and set there again
    mp.spawn(_rank, args=(shape_name, str(tmp_path / "rendezvous")), nprocs=WORLD, join=True)
