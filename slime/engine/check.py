"""Checks every engine shares, run before anything starts: the router's launch flags and fault tolerance.

    rollout.router.extra_args  the installed router's own argument parser (names and values): sglang-router,
                               or vllm-router with rollout.engine=vllm; its health checks and circuit breaker
                               stay off (slime.engine.router.HEALTH_SWITCHES)
    rollout.fault_tolerance    what replaces them: a probe timeout above SGLang's own /health timeout (its ranges
                               are schema rules: slime.config.rules.check_fault_tolerance)

Each engine's own check (slime/engine/<name>/check.py, named by its record in slime.registry.ENGINES) runs the
router check with the router it launches. An unknown key is an error naming the nearest valid names.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Optional

from slime.config.problems import Problem, did_you_mean
from slime.config.schema import RouterConfig, RunConfig
from slime.engine.router import HEALTH_SWITCHES, health_switch_error, router_flags


# ---------------------------------------------------------------------------------------------- router
class _ParserError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str):  # argparse's documented override point
        raise _ParserError(message)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RouterKind:
    """The router an engine runs behind: its package (`module`, imported only when installed), the flags its
    launch appends (`flags`) and its health switches (`health_switches`, which stay off)."""

    name: str  # the pip package: sglang-router | vllm-router
    flags: Callable[[dict[str, Any]], list[str]]
    health_switches: Mapping[str, str]

    @property
    def module(self) -> str:
        return self.name.replace("-", "_")

    def args_class(self) -> Optional[type]:
        """The router's RouterArgs; None when its package is not installed."""
        try:
            return importlib.import_module(f"{self.module}.router_args").RouterArgs
        except ImportError:
            return None


SGLANG_ROUTER = RouterKind(name="sglang-router", flags=router_flags, health_switches=HEALTH_SWITCHES)


def router_parser(kind: RouterKind = SGLANG_ROUTER) -> Optional[argparse.ArgumentParser]:
    """launch_router's parser (as `<router>.launch_router.parse_router_args` builds it), exact names only."""
    router_args = kind.args_class()
    if router_args is None:
        return None
    parser = _RaisingParser(prog=f"{kind.module}.launch_router", allow_abbrev=False, add_help=False)
    router_args.add_cli_args(parser, use_router_prefix=False)
    return parser


def _parse(parser: argparse.ArgumentParser, flags: list[str], kind: RouterKind) -> Optional[str]:
    """None when `flags` parse into RouterArgs; else argparse's (or RouterArgs') complaint."""
    RouterArgs = kind.args_class()

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


def check_router_args(cfg: RunConfig, kind: RouterKind) -> Iterator[Problem]:
    """`rollout.router` and every served model's own `router` (the router each launch gets), against `kind`."""
    yield from _check_router("rollout.router", cfg.rollout.router, kind)
    for i, model in enumerate(cfg.rollout.models):
        yield from _check_router(f"rollout.models[{i}].router", model.router, kind)


def _check_router(prefix: str, r: RouterConfig, kind: RouterKind) -> Iterator[Problem]:
    router, module = kind.name, kind.module
    if r.address is not None:
        if r.extra_args:
            yield Problem(
                f"{prefix}.extra_args",
                dict(r.extra_args),
                f"launch flags do nothing for a router that is joined ({prefix}.address), not launched",
                f"remove {prefix}.extra_args or {prefix}.address",
            )
        return
    parser = router_parser(kind)
    if parser is None:
        yield Problem(
            prefix,
            None,
            f"{router} is not installed; the run launches it",
            f"pip install {router}, or set {prefix}.address=<host:port> of a running router",
        )
        return
    names = sorted(vars(parser.parse_known_args([])[0]))
    error = _parse(parser, ["--policy", r.policy, "--request-timeout-secs", str(r.request_timeout_secs)], kind)
    if error:
        yield Problem(
            f"{prefix}.policy",
            r.policy,
            f"{router} rejects it: {error}",
            f"set {prefix}.policy to one of the router's policies (e.g. round_robin, cache_aware)",
        )
    for name, value in r.extra_args.items():
        key = f"{prefix}.extra_args.{name}"
        error = health_switch_error(name, value, kind.health_switches)
        if error:  # would turn the router's health checks or circuit breaker back on
            yield Problem(key, value, error, f"remove {key}; rollout.fault_tolerance.enabled=true watches the engines")
            continue
        try:
            flags = kind.flags({name: value})
        except ValueError as exc:  # a flag the framework sets itself
            yield Problem(key, value, str(exc), f"remove {key}")
            continue
        if name.replace("-", "_") not in names:
            yield Problem(
                key,
                value,
                f"{router} has no flag --{name.replace('_', '-')}{did_you_mean(name, names)}",
                f"remove {key} or use a launch_router flag name (python -m {module}.launch_router --help)",
            )
            continue
        error = _parse(parser, flags, kind)
        if error:
            yield Problem(key, value, f"{router} rejects {' '.join(flags)}: {error}", f"fix the value of {key}")


# ---------------------------------------------------------------------------------------------- fault tolerance
# SGLang's GET /health generates one token and answers 503 after HEALTH_CHECK_TIMEOUT s without one
# (sglang/srt/entrypoints/http_server.py: `health_generate`, env SGLANG_HEALTH_CHECK_TIMEOUT, default 20); the
# hf engine answers the same way. Its loop looks once a second; the margin covers that and the answer's way back.
SGLANG_HEALTH_TIMEOUT_ENV = "SGLANG_HEALTH_CHECK_TIMEOUT"
SGLANG_HEALTH_TIMEOUT_S = 20.0
HEALTH_TIMEOUT_MARGIN_S = 5.0


def check_generating_health_timeout(cfg: RunConfig) -> Iterator[Problem]:
    """For engines whose GET /health generates a token (SGLang, hf): with fault tolerance on, a probe timeout that
    outlasts the engine's own /health verdict (a shorter one restarts engines SGLang still calls healthy)."""
    ft, key = cfg.rollout.fault_tolerance, "rollout.fault_tolerance"
    if not ft.enabled:
        return
    engine_timeout, source = _engine_health_timeout()
    if engine_timeout is None:
        yield Problem(
            f"{key}.health_check_timeout_s",
            ft.health_check_timeout_s,
            f"the environment's {SGLANG_HEALTH_TIMEOUT_ENV}={source!r} is no integer: SGLang reads it with int() "
            "and would not start",
            f"export {SGLANG_HEALTH_TIMEOUT_ENV}=20 (a whole number of seconds), or unset it",
        )
        return
    floor = engine_timeout + HEALTH_TIMEOUT_MARGIN_S
    if ft.health_check_timeout_s < floor:
        yield Problem(
            f"{key}.health_check_timeout_s",
            ft.health_check_timeout_s,
            f"must be >= {floor:g} s with rollout.engine={cfg.rollout.engine}: the engine's GET /health generates "
            f"a token and waits up to {SGLANG_HEALTH_TIMEOUT_ENV}={engine_timeout:g} s ({source}) for it, so a "
            "shorter probe restarts engines the engine itself calls healthy",
            f"set {key}.health_check_timeout_s={floor:g} (or more)",
        )


def _engine_health_timeout() -> tuple[Optional[float], str]:
    """SGLang's /health timeout as the engines will read it (they inherit this environment; SGLang takes
    `int(os.getenv(...))`) and where it came from; (None, the value) when SGLang could not read it."""
    value = os.environ.get(SGLANG_HEALTH_TIMEOUT_ENV)
    if value is None:
        return SGLANG_HEALTH_TIMEOUT_S, "SGLang's default"
    try:
        return float(int(value)), "set in the environment"
    except ValueError:
        return None, value
