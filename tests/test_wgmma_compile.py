"""CI (CPU only): every WGMMA W4A16 variant that ``w4a16_wgmma.choose_config`` returns for the
dense linear shapes and the V4-Flash / V4-Pro MoE + shared-expert shapes, for every token tile,
compiles for sm_90a without a GPU and exports to an object file (what the disk cache stores)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
pytest.importorskip("cutlass")

from nvfp4_ops.kernels.cute import w4a16_wgmma  # noqa: E402
from nvfp4_ops.shapes import get_shape  # noqa: E402

#: (N, K, epilogue, grouped): the dense linears of the acceptance issues, then per model the
#: shared-expert MLP (gate/up + SwiGLU, down) and the routed experts' grouped GEMMs.
PROBLEMS = [(7168, 18432, "none", False), (18432, 7168, "none", False),
            (4096, 4096, "none", False)]
for _name in ("v4-flash", "v4-pro"):
    _s = get_shape(_name)
    PROBLEMS += [
        (2 * _s.shared_intermediate, _s.hidden, "swiglu", False),
        (_s.hidden, _s.shared_intermediate, "none", False),
        (2 * _s.intermediate, _s.hidden, "swiglu", True),
        (_s.hidden, _s.intermediate, "row_scale", True),
    ]


def _variants():
    seen = {}
    for n, k, epi, grouped in PROBLEMS:
        n_out = n // 2 if epi == "swiglu" else n
        assert w4a16_wgmma.supported(n_out, k), (n, k, epi)
        for bm in w4a16_wgmma.BLOCK_MS:
            cfg = w4a16_wgmma.choose_config(n, k, bm, epi, False, grouped)
            seen.setdefault(cfg.name, cfg)
    # one bias variant (the dense linear with bias)
    cfg = w4a16_wgmma.choose_config(4096, 4096, 128, "none", True, False)
    seen.setdefault(cfg.name, cfg)
    return list(seen.values())


VARIANTS = _variants()


def test_config_names_are_unique_keys():
    assert len({c.name for c in VARIANTS}) == len(VARIANTS)
    for c in VARIANTS:
        assert c.name.startswith("w4a16wg_") and c.name.isidentifier()
        assert c.n_out % c.features_per_cta == 0 and c.num_stages >= 2


def test_unvalidated_configs_are_refused():
    with pytest.raises(ValueError, match="not validated"):
        w4a16_wgmma.WgmmaConfig(4096, 4096, "none", block_m=128, row_wgs=1, split_k=4)
    with pytest.raises(ValueError, match="block_m"):
        w4a16_wgmma.WgmmaConfig(4096, 4096, "none", block_m=48)


@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: c.name)
def test_variant_compiles_for_sm90a(cfg, tmp_path):
    compiled = w4a16_wgmma.compile_gemm(cfg)
    path = tmp_path / f"{cfg.name}.o"
    compiled.export_to_c(str(path), function_name=cfg.name)
    assert path.stat().st_size > 0
