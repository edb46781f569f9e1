"""The installed vLLM's own argument parser, read for `slime.engine.vllm.engine_args.parser_fields`.

Imports vllm at module level: `parser_fields` imports this module only when vllm is importable.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from typing import Any

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import FrontendArgs, make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser


def parser_fields() -> dict[str, dict[str, str]]:
    """argparse dest -> {"flag": its long flag, "type": the field's annotation as text}, sorted by name (see
    `slime.engine.vllm.engine_args.parser_fields`)."""
    parser = make_arg_parser(FlexibleArgumentParser())
    types = {f.name: type_text(f.type) for cls in (FrontendArgs, AsyncEngineArgs) for f in dataclasses.fields(cls)}
    fields = {
        action.dest: {"flag": long_flag(action.option_strings), "type": types.get(action.dest, "")}
        for action in parser._actions  # argparse keeps no public list of its actions
        if action.option_strings and action.dest not in ("help", argparse.SUPPRESS) and not action.dest.startswith("_")
    }
    return dict(sorted(fields.items()))


def long_flag(options: list[str]) -> str:
    return next((option for option in options if option.startswith("--")), options[0])


_QUOTED = re.compile(r"('[^']*'|\"[^\"]*\")")
_QUALIFIED = re.compile(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])")  # typing.X, vllm.config.foo.Y -> X, Y


def type_text(annotation: Any) -> str:
    """An annotation as short source-like text: `int` -> "int" (str() gives "<class 'int'>"), `int | None` ->
    "int | None", `typing.Optional[vllm.config.x.C]` -> "Optional[C]"; quoted literals are kept as they are."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    parts = _QUOTED.split(str(annotation))
    return "".join(p if i % 2 else _QUALIFIED.sub("", p).replace("NoneType", "None") for i, p in enumerate(parts))
