"""vLLM glue for nvfp4-ops (see :mod:`model_glue.plugin`)."""
