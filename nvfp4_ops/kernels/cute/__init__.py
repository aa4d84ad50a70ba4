"""CuTeDSL kernels (one module per kernel family) and their shared PTX helpers.

Importing this package sets ``CUTE_DSL_ARCH`` (default ``sm_90a``) before cutlass is imported,
so the kernels compile without a GPU or a driver query.
"""

from nvfp4_ops._compile import ensure_cutlass_env

ensure_cutlass_env()
