"""Shared test setup: GPU tests skip without CUDA; NVFP4 test data helpers."""

from __future__ import annotations

import os

import pytest
import torch

# Without CUDA, Triton kernels can only run in Triton's interpreter (on CPU tensors). The
# switch is read when triton is first imported, so set it here, before any test imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def cuda_moe_kernel():
    """For the GPU MoE tests: skip without CUDA, and make sure ``nvfp4::moe`` dispatches to the
    CUDA kernels (``moe_cuda``), so no test can pass on the GPU reference fallback."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from nvfp4_ops import kernels
    from nvfp4_ops.kernels import moe_cuda

    assert kernels.cuda_kernel("moe") is moe_cuda.moe_launch
