"""The plugin as vLLM sees it: entry point, idempotence, and "off means stock".

The enabled/disabled checks run in fresh interpreters: vLLM loads plugins and registers
quantization configs once per process, so the process is the unit that matters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import cpu_standins
import pytest

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_entry_point_is_discoverable():
    from model_glue import plugin

    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "nvfp4_ops"]
    assert len(eps) == 1, "pip install -e . (the entry point comes from pyproject.toml)"
    assert eps[0].value == "model_glue.plugin:register"
    assert eps[0].load() is plugin.register


@pytest.mark.parametrize("value", ["bogus", "2", "enabled"])
def test_bad_switch_value_is_refused_by_name(monkeypatch, value):
    """``NVFP4_OPS_VLLM`` takes the package's boolean spellings only: anything else stops the
    plugin with an error naming the variable and the value, never a silent "off"."""
    from model_glue import plugin
    from nvfp4_ops._env import NVFP4EnvError

    monkeypatch.setenv("NVFP4_OPS_VLLM", value)
    with pytest.raises(NVFP4EnvError, match=rf"NVFP4_OPS_VLLM must be one of .*got '{value}'"):
        plugin.enabled()
    monkeypatch.setattr(plugin, "_installed", None)  # as in a fresh process
    with pytest.raises(NVFP4EnvError, match="NVFP4_OPS_VLLM"):
        plugin.register()


def _run(code: str, env_switch: str | None, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NVFP4_OPS_VLLM"}
    if env_switch is not None:
        env["NVFP4_OPS_VLLM"] = env_switch
    env["PYTHONPATH"] = os.pathsep.join([HERE, ROOT, env.get("PYTHONPATH", "")])
    out = tmp_path / "result.json"
    script = textwrap.dedent(code).replace("RESULT_PATH", repr(str(out)))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=400, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    result["log"] = proc.stdout + proc.stderr
    return result


_ENABLED = """
    import json, logging
    import torch
    logging.basicConfig(level=logging.INFO)  # a script has no vLLM log handler yet
    from vllm.plugins import load_general_plugins
    load_general_plugins()          # vLLM runs our entry point
    from model_glue import plugin
    first = plugin.register()       # ... and a second and third call change nothing
    second = plugin.register()
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.models.registry import ModelRegistry
    dsv4 = get_quantization_config("deepseek_v4_fp8")
    json.dump({
        "first": first, "same": first is second,
        "dsv4": dsv4.__module__ + "." + dsv4.__name__,
        "dsv4_base": dsv4.__mro__[1].__module__,
        "modelopt": get_quantization_config("modelopt_fp4").__module__,
        "model": str(ModelRegistry.models["DeepseekV4ForCausalLM"]),
        "cuda_initialized": torch.cuda.is_initialized(),
    }, open(RESULT_PATH, "w"))
"""


def test_enabled_registers_once_without_cuda(tmp_path):
    r = _run(_ENABLED, "1", tmp_path)
    assert r["same"] and len(r["first"]) == 3
    assert r["dsv4"] == "model_glue.configs.Nvfp4OpsDeepseekV4FP8Config"
    assert r["dsv4_base"].startswith("vllm.models.deepseek_v4")
    assert r["modelopt"] == "model_glue.configs"
    assert "model_glue.models" in r["model"]
    assert not r["cuda_initialized"]
    assert r["log"].count("nvfp4_ops glue enabled") == 1, r["log"][-3000:]


_DISABLED = """
    import json, logging, sys
    logging.basicConfig(level=logging.INFO)
    import pytest
    import cpu_standins
    mp = pytest.MonkeyPatch()
    cpu_standins.install(mp)
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from model_glue import plugin
    taken = plugin.register()
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.models.registry import ModelRegistry
    from dsv4_ckpt import Checkpoint
    Checkpoint("fp8", seed=3).write("ckpt", "native")
    from vllm.engine.arg_utils import EngineArgs
    vc = EngineArgs(model="ckpt", skip_tokenizer_init=True, enforce_eager=True,
                    max_model_len=256, dtype="bfloat16").create_engine_config()
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    error = ""
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
        initialize_model_parallel(1, 1)
        from vllm.model_executor.model_loader.utils import initialize_model
        try:
            initialize_model(vllm_config=vc)
        except Exception as e:  # vLLM's own NVFP4 MoE method, which has no CPU backend
            import traceback
            error = traceback.format_exc()
    dsv4 = get_quantization_config("deepseek_v4_fp8")
    json.dump({
        "taken": taken,
        "dsv4": dsv4.__module__, "quant_config": type(vc.quant_config).__module__,
        "modelopt": get_quantization_config("modelopt_fp4").__module__,
        "model": str(ModelRegistry.models["DeepseekV4ForCausalLM"]),
        "error": error,
    }, open(RESULT_PATH, "w"))
"""


@pytest.mark.skipif(vllm.__version__ != cpu_standins.VLLM_VERSION,
                    reason=f"CPU stand-ins are pinned to vLLM {cpu_standins.VLLM_VERSION}")
@pytest.mark.parametrize("switch", [None, "0"])
def test_disabled_means_stock_vllm(tmp_path, switch):
    r = _run(_DISABLED, switch, tmp_path)
    assert r["taken"] == []
    assert r["dsv4"].startswith("vllm.") and r["quant_config"].startswith("vllm.")
    assert r["modelopt"].startswith("vllm.")
    assert "model_glue" not in r["model"]
    # vLLM picked its own ModelOptNvFp4FusedMoE for the routed experts (which then finds no
    # NVFP4 MoE backend on a CPU-only machine); our method never appears.
    assert "ModelOptNvFp4FusedMoE" in r["error"] or "NvFp4 MoE backend" in r["error"], \
        r["error"][-2000:]
    assert "model_glue" not in r["error"]
    assert "nvfp4_ops glue enabled" not in r["log"]
