"""Passthrough dicts, checked against the library they pass through to, before anything starts.

    rollout.router.extra_args  the installed sglang-router's own argument parser (names and values)
    rollout.sglang             SGLang ServerArgs fields (slime.engine.sglang.server_args: the only sglang code)
    parallelism.megatron       megatron-core's config dataclasses (slime.train.megatron.config_check)

An unknown key is an error naming the nearest valid names, never a warning.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator
from typing import Optional

from slime.config.problems import Problem, did_you_mean
from slime.config.schema import RunConfig


def check_passthrough(cfg: RunConfig) -> Iterator[Problem]:
    yield from check_router_args(cfg)
    yield from check_sglang_args(cfg)
    yield from check_megatron_args(cfg)


# ---------------------------------------------------------------------------------------------- router
class _ParserError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str):  # argparse's documented override point
        raise _ParserError(message)


def router_parser() -> Optional[argparse.ArgumentParser]:
    """launch_router's parser (as `sglang_router.launch_router.parse_router_args` builds it), exact names only."""
    try:
        from sglang_router.router_args import RouterArgs
    except ImportError:
        return None
    parser = _RaisingParser(prog="sglang_router.launch_router", allow_abbrev=False, add_help=False)
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return parser


def _parse(parser: argparse.ArgumentParser, flags: list[str]) -> Optional[str]:
    """None when `flags` parse into RouterArgs; else argparse's (or RouterArgs') complaint."""
    from sglang_router.router_args import RouterArgs

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            namespace, unknown = parser.parse_known_args(flags)
            if unknown:
                return f"unrecognized arguments: {' '.join(unknown)}"
            RouterArgs.from_cli_args(namespace, use_router_prefix=False)
    except _ParserError as exc:
        return str(exc)
    except SystemExit as exc:  # an action that exits (e.g. a version flag)
        return f"the router's parser exited ({exc.code})"
    except (ValueError, TypeError) as exc:  # RouterArgs' own parsing of selectors, URLs, key lists
        return str(exc)
    return None


def check_router_args(cfg: RunConfig) -> Iterator[Problem]:
    from slime.engine.router import router_flags  # the flags Router.launch appends, built by the same code

    r = cfg.rollout.router
    if r.address is not None:
        if r.extra_args:
            yield Problem(
                "rollout.router.extra_args",
                dict(r.extra_args),
                "launch flags do nothing for a router that is joined (rollout.router.address), not launched",
                "remove rollout.router.extra_args or rollout.router.address",
            )
        return
    parser = router_parser()
    if parser is None:
        yield Problem(
            "rollout.router",
            None,
            "sglang-router is not installed; the run launches it",
            "pip install sglang-router, or set rollout.router.address=<host:port> of a running router",
        )
        return
    names = sorted(vars(parser.parse_known_args([])[0]))
    error = _parse(parser, ["--policy", r.policy, "--request-timeout-secs", str(r.request_timeout_secs)])
    if error:
        yield Problem(
            "rollout.router.policy",
            r.policy,
            f"sglang-router rejects it: {error}",
            "set rollout.router.policy to one of the router's policies (e.g. round_robin, cache_aware)",
        )
    for name, value in r.extra_args.items():
        key = f"rollout.router.extra_args.{name}"
        try:
            flags = router_flags({name: value})
        except ValueError as exc:  # a flag the framework sets itself
            yield Problem(key, value, str(exc), f"remove {key}")
            continue
        if name.replace("-", "_") not in names:
            yield Problem(
                key,
                value,
                f"sglang-router has no flag --{name.replace('_', '-')}{did_you_mean(name, names)}",
                f"remove {key} or use a launch_router flag name (python -m sglang_router.launch_router --help)",
            )
            continue
        error = _parse(parser, flags)
        if error:
            yield Problem(key, value, f"sglang-router rejects {' '.join(flags)}: {error}", f"fix the value of {key}")


# ---------------------------------------------------------------------------------------------- sglang
def check_sglang_args(cfg: RunConfig) -> Iterator[Problem]:
    """`rollout.sglang` and every server group's `overrides`: ServerArgs fields the framework does not own."""
    from slime.engine.sglang.server_args import check_server_args

    sources = [("rollout.sglang", dict(cfg.rollout.sglang))]
    for i, model in enumerate(cfg.rollout.models):
        for j, group in enumerate(model.server_groups):
            sources.append((f"rollout.models[{i}].server_groups[{j}].overrides", dict(group.overrides)))
    for prefix, args in sources:
        if not args:
            continue
        if cfg.rollout.engine != "sglang":
            yield Problem(
                prefix,
                args,
                f"SGLang server args do nothing with rollout.engine={cfg.rollout.engine}",
                "remove them or use the sglang engine (rollout=sglang)",
            )
        for issue in check_server_args(args, prefix=prefix):
            yield Problem(issue.key, args[issue.key.rpartition(".")[2]], issue.message, issue.fix)


# ---------------------------------------------------------------------------------------------- megatron
def check_megatron_args(cfg: RunConfig) -> Iterator[Problem]:
    """parallelism.megatron and the megatron backend's own rules (slime.train.megatron.config_check)."""
    from slime.train.megatron.config_check import check_megatron

    yield from check_megatron(cfg)
