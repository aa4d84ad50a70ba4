"""``python -m nvfp4_ops`` (also the ``nvfp4-ops`` script): the command-line tools.

Subcommands (each module's ``main(argv, prog)``):

* ``check``: build a DeepSeek-V4-shaped MoE layer, run ``nvfp4::moe`` eagerly, compiled and in
  a CUDA graph, and compare with a bf16-dequantized reference (the main job).
* ``precompile``: compile (CPU) or compile and run once (GPU) every kernel variant a shape
  needs.

Errors in arguments end in one line and exit code 2 (argparse's convention).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap

_COMMANDS = {
    "check": ("nvfp4_ops.cli.check",
              "build a DeepSeek-V4-shaped MoE layer, run nvfp4::moe eagerly, compiled and in "
              "a CUDA graph, and compare with a bf16-dequantized reference"),
    "precompile": ("nvfp4_ops.cli.precompile",
                   "compile (CPU) or compile and run once (GPU) every kernel variant a model "
                   "shape needs, into the disk cache"),
}


def program_name(argv0: str | None = None) -> str:
    """The program as invoked: ``nvfp4-ops`` for the script, ``python -m nvfp4_ops`` for
    ``-m`` (where ``sys.argv[0]`` is this file's path)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    name = os.path.basename(argv0 or "")
    if not name or name.endswith(".py") or name == "-c":
        return "python -m nvfp4_ops"
    return name


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prog = program_name() if prog is None else prog
    width = max(len(c) for c in _COMMANDS)
    listing = "\n".join(
        textwrap.fill(text, 79, initial_indent=f"  {c.ljust(width)}  ",
                      subsequent_indent=" " * (width + 4))
        for c, (_, text) in _COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Tools of nvfp4-ops (NVFP4 weight-only ops for DeepSeek-V4 on Hopper GPUs).",
        epilog=f"commands:\n{listing}\n\n'{prog} COMMAND --help' lists a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=list(_COMMANDS), help="what to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="options of the command")
    ns = parser.parse_args(argv[:1])
    module_name, _ = _COMMANDS[ns.command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        print(f"{prog}: '{ns.command}' is not available in this build", file=sys.stderr)
        return 2
    return module.main(argv[1:], prog=f"{prog} {ns.command}")


if __name__ == "__main__":
    sys.exit(main())
