"""Programmatic dependent launch (PDL) for the MoE's Triton kernels.

A kernel launched with PDL may start while the previous kernel on the stream is still
running; it must execute ``griddepcontrol.wait`` (``gdc_wait``) before it reads anything
an earlier kernel wrote or writes anything, and it lets the next kernel start early with
``griddepcontrol.launch_dependents`` (``gdc_launch_dependents``). Both are no-ops in a kernel
launched without PDL. See ``nvfp4_ops/kernels/moe_cuda.py`` ("Launch overlap") for the
ordering argument of the whole MoE chain.
"""

from __future__ import annotations

import triton

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    SUPPORTED = True
except ImportError:  # a Triton without the griddepcontrol wrappers: PDL stays off
    SUPPORTED = False

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass

__all__ = ["SUPPORTED", "gdc_launch_dependents", "gdc_wait", "launch_kwargs"]


def launch_kwargs(pdl: bool) -> dict:
    """Extra launch keyword arguments of a Triton kernel: PDL on (``launch_pdl``) or nothing."""
    return {"launch_pdl": True} if pdl and SUPPORTED else {}
