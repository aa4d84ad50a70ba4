"""``python -m nvfp4_ops`` (also the ``nvfp4-ops`` script).

Subcommands:
  check        build a DeepSeek-V4-shaped MoE layer, run nvfp4::moe eager / compiled /
               CUDA-graph and compare against a bf16-dequantized reference (the main job)
  precompile   compile (CPU) or compile and run once (GPU) every kernel variant a shape needs
"""

from __future__ import annotations

import argparse
import importlib
import sys

_COMMANDS = {
    "check": ("nvfp4_ops.cli.check", "check a DeepSeek-V4 MoE layer end to end"),
    "precompile": ("nvfp4_ops.cli.precompile", "fill the kernel cache for a shape"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m nvfp4_ops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=sorted(_COMMANDS), help="what to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="options of the command")
    ns = parser.parse_args(argv[:1])
    module_name, _ = _COMMANDS[ns.command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        print(f"nvfp4_ops: '{ns.command}' is not available in this build", file=sys.stderr)
        return 2
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
