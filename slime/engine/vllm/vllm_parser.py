"""The installed vLLM's own argument parser, read for `slime.engine.vllm.engine_args.parser_fields`.

Imports vllm at module level: `parser_fields` imports this module only when vllm is importable.
"""

from __future__ import annotations

import argparse
import dataclasses

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import FrontendArgs, make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

from slime.engine.vllm.engine_args import long_flag, type_text


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
