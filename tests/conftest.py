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
