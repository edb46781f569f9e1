"""The install command for a library a run imports by name and the machine lacks, where we know it: validation's
message for a missing dependency ends in it (a reward type's, a hook's, a custom data source's).

Keyed by the top-level import name, which is not always the distribution's name (`math_verify` installs as
`math-verify`, `megatron` as `megatron-core`); the project's extras install the engines and the optional sinks."""

from __future__ import annotations

from typing import Optional

INSTALL_COMMANDS = {
    "math_verify": "pip install math-verify",  # rollout.rm_type=math, deepscaler, dapo
    "latex2sympy2_extended": "pip install latex2sympy2_extended",  # math-verify's LaTeX parser
    "sympy": "pip install sympy",
    "peft": "pip install peft",
    "sglang": "pip install -e '.[sglang]'",
    "vllm": "pip install -e '.[vllm]'",
    "megatron": "pip install -e '.[megatron]'",
    "gguf": "pip install -e '.[smollm2]'",
    "accelerate": "pip install -e '.[smollm2]'",
    "tensorboard": "pip install -e '.[tensorboard]'",
    "wandb": "pip install wandb",
    "pyarrow": "pip install pyarrow",
    "aiohttp": "pip install aiohttp",
    "optuna": "pip install -e '.[sweep]'",
}


def install_command(module: str) -> Optional[str]:
    """`pip install ...` for the missing module `module` (a dotted name: its top-level package decides), or None."""
    return INSTALL_COMMANDS.get(module.partition(".")[0])


def install_fix(module: str) -> str:
    """A Problem's fix for the missing module `module`: its install command, or what to look for."""
    command = install_command(module)
    if command is not None:
        return f"install it: {command}"
    return f"install the package that provides the module {module.partition('.')[0]!r} into this environment"
