"""``wfrag``: the dense weights' codes in MMA-fragment order: what ``nvfp4::linear`` /
``nvfp4::mlp`` with ``wfrag=True`` read, prepared in place by ``nvfp4::to_wfrag_``
(:func:`prepare_`: this order, then the ``wperm`` bits).

Why: every kernel family decodes a lane's u32 word of 8 codes with ``pair4``
(:func:`nvfp4_ops.kernels.cute.fp4_ptx.decode_word_pair4`), which yields the 4 bf16x2
registers ``(code j, code j + 4)``, ``j = 0..3``. The MMA A fragment (``mma.sync.m16n8k16``
and register-sourced WGMMA alike) wants lane ``c`` of a quad to hold, per 32-k chunk of a
row, the k pairs ``8 j + 2 c + {0, 1}``. With checkpoint-order weights the two meet only if
the *activations* are permuted (the MoE's ``kperm`` / ``pair`` orders, free in its gather),
or the kernel gathers bytes from 16 (the dense WGMMA path) or ``prmt``s the activations (the
dense streamed path). A dense linear gets natural-order ``x`` from its caller, and permuting it
costs a pass over ``x`` (measured: as much as the kernel saves; ``DESIGN.md``, section 7).

So permute the weights instead, once, offline: inside every 32-k block of a row (16 bytes,
4 u32 words), word ``c`` holds code ``8 j + 2 c`` in nibble ``j`` and code ``8 j + 2 c + 1``
in nibble ``j + 4``. Stored nibble ``q = 8 c + n`` (nibble ``n`` of word ``c``) holds checkpoint
code :func:`source(q) <source>` ``= 8 (q % 4) + q // 4``, the inverse of the ``kperm``
activation permutation (``kperm.dst``). Then ``pair4`` on word ``c`` gives register ``j`` =
the natural k pair ``(8 j + 2 c, 8 j + 2 c + 1)``:

* the WGMMA kernel: lane ``c`` loads its word ``c`` of the 16-byte chunk (one 4-byte shared
  load, as the ``kperm`` path) and the activations stay natural;
* the streamed and ``mma.sync`` kernels (a lane owns a whole 32-k block): word ``i``'s register
  ``j`` pairs with the natural activation u32 ``4 j + i`` of the block, i.e. element ``i`` of
  the block's ``j``-th 16-byte load: no ``prmt``.

Block scales: registers 0-1 hold k of the block's first 16 (scale ``2 b``), registers 2-3 of
its second (scale ``2 b + 1``), so the decoders take two scales
(:func:`~nvfp4_ops.kernels.cute.fp4_ptx.decode_word_pair4_2s`). The ``wperm`` bit order
(:mod:`nvfp4_ops.orders.wperm`) composes: ``to_wperm(to_wfrag(w))``. Scales and bytes
outside each 16-byte block are unchanged; only the reduction order of k changes, so outputs
match the checkpoint order up to fp32 summation order.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["BLOCK_K", "emulate_lane_dot", "from_wfrag", "prepare_", "source", "to_wfrag",
           "unprepared"]

#: the permutation acts inside blocks of this many k (16 bytes of a row)
BLOCK_K = 32


def source(q: int) -> int:
    """Checkpoint code (k within its 32-block) stored at nibble ``q`` of the block."""
    return 8 * (q % 4) + q // 4


@functools.cache
def _source_index() -> tuple[int, ...]:
    return tuple(source(q) for q in range(BLOCK_K))


@functools.cache
def _dest_index() -> tuple[int, ...]:
    inv = [0] * BLOCK_K
    for q, k in enumerate(_source_index()):
        inv[k] = q
    return tuple(inv)


def _codes(w: torch.Tensor) -> torch.Tensor:
    return torch.stack((w & 0x0F, w >> 4), dim=-1).reshape(*w.shape[:-1], 2 * w.shape[-1])


def _pack(codes: torch.Tensor) -> torch.Tensor:
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def _permute(w: torch.Tensor, index: tuple[int, ...], out: torch.Tensor | None = None):
    """``w`` with the codes of every 32-k block gathered by ``index`` into ``out`` (a new
    contiguous tensor when None; may be ``w``: each row block is read whole before it is
    written)."""
    if w.dtype != torch.uint8 or w.dim() < 1 or w.shape[-1] % (BLOCK_K // 2) != 0:
        raise ValueError(f"w must be uint8 [..., K/2] with K a multiple of {BLOCK_K}, got "
                         f"{w.dtype} {tuple(w.shape)}")
    if out is None:
        out = torch.empty_like(w, memory_format=torch.contiguous_format)
    idx = torch.tensor(index, device=w.device)
    flat, flat_out = w.reshape(-1, w.shape[-1]), out.view(-1, w.shape[-1])
    # row blocks bound the temporaries (~24x the bytes of the block)
    step = max(1, (1 << 24) // max(1, flat.shape[1]))
    for r in range(0, flat.shape[0], step):
        codes = _codes(flat[r:r + step])
        blocks = codes.reshape(codes.shape[0], -1, BLOCK_K)
        flat_out[r:r + step] = _pack(blocks[..., idx].reshape(codes.shape))
    return out


def to_wfrag(w: torch.Tensor) -> torch.Tensor:
    """Checkpoint-order packed codes ``uint8 [..., K/2]`` (``K % 32 == 0``) -> the ``wfrag``
    order (same shape, dtype and device; a new contiguous tensor)."""
    return _permute(w, _source_index())


def from_wfrag(w: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_wfrag`."""
    return _permute(w, _dest_index())


def prepare_(w: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """In place on a contiguous ``w``: the checkpoint order -> this order, then the ``wperm``
    bit order (what ``wfrag=True`` ops read); ``inverse``: back. Temporaries of one row block.
    Returns ``w``."""
    from nvfp4_ops.orders import wperm

    if not w.is_contiguous():
        raise ValueError("w must be contiguous for the in-place permutation")
    if inverse:
        wperm.permute_(w, inverse=True)
        return _permute(w, _dest_index(), w)
    _permute(w, _source_index(), w)
    return wperm.permute_(w)


def unprepared(w: torch.Tensor) -> torch.Tensor:
    """A checkpoint-order copy of weights prepared by :func:`prepare_` (for the references)."""
    from nvfp4_ops.orders.wperm import from_wperm

    return from_wfrag(from_wperm(w))


def emulate_lane_dot(w_wfrag: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """What the kernels compute from ``wfrag`` codes, in torch (for tests): every u32 word
    ``c`` of a 32-k block decoded as ``pair4`` does (register ``j`` = (nibble ``j``, nibble
    ``j + 4``)), each register multiplied by the natural activation pair it meets in the MMA
    (k ``8 j + 2 c + {0, 1}`` of the block). Returns the e2m1 value dot products ``[N, M]``
    (fp64) for codes ``uint8 [N, K/2]`` and activations ``[M, K]``; equal to the checkpoint
    order's ``e2m1(w) @ x.T`` up to summation order."""
    from nvfp4_ops.format import E2M1_VALUES

    n, kh = w_wfrag.shape
    k = 2 * kh
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    codes = _codes(w_wfrag.cpu()).long().reshape(n, k // BLOCK_K, 4, 8)  # [N, blocks, c, nib]
    xb = x.double().cpu().reshape(x.shape[0], k // BLOCK_K, BLOCK_K)
    out = torch.zeros(n, x.shape[0], dtype=torch.float64)
    for c in range(4):
        for j in range(4):
            for half in range(2):  # low bf16 = nibble j, high = nibble j + 4
                vals = lut[codes[:, :, c, j + 4 * half]]  # [N, blocks]
                out += vals @ xb[:, :, 8 * j + 2 * c + half].T
    return out
