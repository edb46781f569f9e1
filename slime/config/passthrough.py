"""Passthrough dicts, checked against the library they pass through to, before anything starts.

    rollout.router.extra_args  the installed router's own argument parser (names and values): sglang-router,
                               or vllm-router with rollout.engine=vllm; its health checks and circuit breaker
                               stay off (slime.engine.router.HEALTH_SWITCHES)
    rollout.fault_tolerance    what replaces them: a probe timeout above SGLang's own /health timeout
    rollout.sglang             SGLang ServerArgs fields (slime.engine.sglang.server_args: the only sglang code)
    rollout.vllm               vLLM server arguments (slime.engine.vllm.engine_args: the only vllm code)
    parallelism.megatron       megatron-core's config dataclasses (slime.train.megatron.config_check)

An unknown key is an error naming the nearest valid names, never a warning.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from collections.abc import Iterator
from typing import Optional

from slime.config.problems import Problem, did_you_mean, positive
from slime.config.schema import RouterConfig, RunConfig


def check_passthrough(cfg: RunConfig) -> Iterator[Problem]:
    yield from check_router_args(cfg)
    yield from check_fault_tolerance(cfg)
    yield from check_sglang_args(cfg)
    yield from check_vllm_args(cfg)
    yield from check_megatron_args(cfg)


# ---------------------------------------------------------------------------------------------- router
class _ParserError(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str):  # argparse's documented override point
        raise _ParserError(message)


def _router_args_class(engine: str) -> Optional[type]:
    """The RouterArgs of the router `engine` runs behind (vllm-router for vllm, else sglang-router); None if absent."""
    try:
        if engine == "vllm":
            from vllm_router.router_args import RouterArgs
        else:
            from sglang_router.router_args import RouterArgs
    except ImportError:
        return None
    return RouterArgs


def _router_name(engine: str) -> str:
    return "vllm-router" if engine == "vllm" else "sglang-router"


def router_parser(engine: str = "sglang") -> Optional[argparse.ArgumentParser]:
    """launch_router's parser (as `<router>.launch_router.parse_router_args` builds it), exact names only."""
    router_args = _router_args_class(engine)
    if router_args is None:
        return None
    module = _router_name(engine).replace("-", "_")
    parser = _RaisingParser(prog=f"{module}.launch_router", allow_abbrev=False, add_help=False)
    router_args.add_cli_args(parser, use_router_prefix=False)
    return parser


def _parse(parser: argparse.ArgumentParser, flags: list[str], engine: str = "sglang") -> Optional[str]:
    """None when `flags` parse into RouterArgs; else argparse's (or RouterArgs') complaint."""
    RouterArgs = _router_args_class(engine)

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
    """`rollout.router` and every served model's own `router` (the router each launch gets)."""
    engine = cfg.rollout.engine
    yield from _check_router("rollout.router", cfg.rollout.router, engine)
    for i, model in enumerate(cfg.rollout.models):
        yield from _check_router(f"rollout.models[{i}].router", model.router, engine)


def _check_router(prefix: str, r: RouterConfig, engine: str) -> Iterator[Problem]:
    from slime.engine.router import health_switch_error

    if engine == "vllm":
        from slime.engine.vllm.engine_args import router_flags  # what the vllm-router launch appends
        from slime.engine.vllm.router import VLLMRouter as router_class
    else:
        from slime.engine.router import Router as router_class
        from slime.engine.router import router_flags  # the flags Router.launch appends, built by the same code
    router, module = _router_name(engine), _router_name(engine).replace("-", "_")
    if r.address is not None:
        if r.extra_args:
            yield Problem(
                f"{prefix}.extra_args",
                dict(r.extra_args),
                f"launch flags do nothing for a router that is joined ({prefix}.address), not launched",
                f"remove {prefix}.extra_args or {prefix}.address",
            )
        return
    parser = router_parser(engine)
    if parser is None:
        yield Problem(
            prefix,
            None,
            f"{router} is not installed; the run launches it",
            f"pip install {router}, or set {prefix}.address=<host:port> of a running router",
        )
        return
    names = sorted(vars(parser.parse_known_args([])[0]))
    error = _parse(parser, ["--policy", r.policy, "--request-timeout-secs", str(r.request_timeout_secs)], engine)
    if error:
        yield Problem(
            f"{prefix}.policy",
            r.policy,
            f"{router} rejects it: {error}",
            f"set {prefix}.policy to one of the router's policies (e.g. round_robin, cache_aware)",
        )
    for name, value in r.extra_args.items():
        key = f"{prefix}.extra_args.{name}"
        error = health_switch_error(name, value, router_class.health_switches)
        if error:  # would turn the router's health checks or circuit breaker back on
            yield Problem(key, value, error, f"remove {key}; rollout.fault_tolerance.enabled=true watches the engines")
            continue
        try:
            flags = router_flags({name: value})
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
        error = _parse(parser, flags, engine)
        if error:
            yield Problem(key, value, f"{router} rejects {' '.join(flags)}: {error}", f"fix the value of {key}")


# ---------------------------------------------------------------------------------------------- fault tolerance
# SGLang's GET /health generates one token and answers 503 after HEALTH_CHECK_TIMEOUT s without one
# (sglang/srt/entrypoints/http_server.py: `health_generate`, env SGLANG_HEALTH_CHECK_TIMEOUT, default 20); the
# hf engine answers the same way. Its loop looks once a second; the margin covers that and the answer's way back.
SGLANG_HEALTH_TIMEOUT_ENV = "SGLANG_HEALTH_CHECK_TIMEOUT"
SGLANG_HEALTH_TIMEOUT_S = 20.0
HEALTH_TIMEOUT_MARGIN_S = 5.0
_GENERATING_HEALTH = ("sglang", "hf")  # engine kinds whose /health is that generation


def check_fault_tolerance(cfg: RunConfig) -> Iterator[Problem]:
    """With `rollout.fault_tolerance.enabled`: positive interval and timeout, and a timeout that outlasts the
    engine's own /health verdict (a shorter one restarts engines SGLang still calls healthy)."""
    ft, key = cfg.rollout.fault_tolerance, "rollout.fault_tolerance"
    if not ft.enabled:
        return
    yield from positive(cfg, f"{key}.health_check_interval_s", f"{key}.health_check_timeout_s")
    if ft.max_restarts < 0:
        yield Problem(f"{key}.max_restarts", ft.max_restarts, "must be >= 0", f"set {key}.max_restarts=3")
    if cfg.rollout.engine not in _GENERATING_HEALTH:
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


# ---------------------------------------------------------------------------------------------- sglang
def check_sglang_args(cfg: RunConfig) -> Iterator[Problem]:
    """`rollout.sglang` and every server group's `overrides`: ServerArgs fields the framework does not own, with
    values SGLang's command line carries; and an installed sglang must be the version whose parser is recorded."""
    from slime.engine.sglang.server_args import check_server_args, installed_version_issue

    if cfg.rollout.engine == "sglang":
        issue = installed_version_issue()
        if issue is not None:
            yield Problem(issue.key, None, issue.message, issue.fix)
    sources = [("rollout.sglang", dict(cfg.rollout.sglang))]
    if cfg.rollout.engine != "vllm":  # with vllm the groups' overrides are vLLM arguments (check_vllm_args)
        sources += _group_overrides(cfg)
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


def _group_overrides(cfg: RunConfig) -> list[tuple[str, dict]]:
    return [
        (f"rollout.models[{i}].server_groups[{j}].overrides", dict(group.overrides))
        for i, model in enumerate(cfg.rollout.models)
        for j, group in enumerate(model.server_groups)
    ]


# ---------------------------------------------------------------------------------------------- vllm
def check_vllm_args(cfg: RunConfig) -> Iterator[Problem]:
    """`rollout.vllm` and (with rollout.engine=vllm) every server group's `overrides`: vLLM server arguments
    the framework does not own; the parallel sizes each server ends up with must split its GPUs."""
    from slime.engine.vllm.engine_args import check_engine_args

    base, engine = dict(cfg.rollout.vllm), cfg.rollout.engine
    if base and engine != "vllm":
        yield Problem(
            "rollout.vllm",
            base,
            f"vLLM server arguments do nothing with rollout.engine={engine}",
            "remove them or use the vllm engine (rollout=vllm)",
        )
    problems = _engine_arg_problems("rollout.vllm", base, check_engine_args)
    yield from problems
    if engine != "vllm":
        return
    # (the key holding the server's arguments, those arguments, the key deciding its GPUs, their number)
    servers = [("rollout.vllm", base, *_cluster_gpus(cfg))]
    if cfg.rollout.models:
        servers = []
        groups = [group for model in cfg.rollout.models for group in model.server_groups]
        for (prefix, overrides), group in zip(_group_overrides(cfg), groups):
            group_problems = _engine_arg_problems(prefix, overrides, check_engine_args)
            yield from group_problems
            own = prefix.replace(".overrides", ".num_gpus_per_engine")
            gpus = (own, group.num_gpus_per_engine) if group.num_gpus_per_engine else _cluster_gpus(cfg)
            if not group_problems:  # sizes of a wrong type are reported above
                servers.append((prefix, {**base, **overrides}, *gpus))
    if not problems:
        yield from _split_problems(servers)
        yield from _prefill_problems(cfg)


def _cluster_gpus(cfg: RunConfig) -> tuple[str, int]:
    return "cluster.rollout.num_gpus_per_engine", cfg.cluster.rollout.num_gpus_per_engine


def _engine_arg_problems(prefix: str, args: dict, check) -> list[Problem]:
    return [Problem(i.key, args[i.key.rpartition(".")[2]], i.message, i.fix) for i in check(args, prefix=prefix)]


def _prefill_problems(cfg: RunConfig) -> Iterator[Problem]:
    """`rollout.vllm.prefill_num_servers` (the seeds' --prefill-num-servers) leaves at least one decode server."""
    from slime.config.derive import derive

    n, key = cfg.rollout.vllm.get("prefill_num_servers"), "rollout.vllm.prefill_num_servers"
    if not n:
        return
    if cfg.rollout.models:
        yield Problem(
            key,
            n,
            "rollout.models sets each server group's worker type itself",
            f"remove {key}; give the groups worker_type: prefill / decode",
        )
        return
    servers = derive(cfg).rollout_gpus // max(cfg.cluster.rollout.num_gpus_per_engine, 1)
    if n >= servers:
        yield Problem(
            key,
            n,
            f"leaves no decode server: the policy has {servers} server(s)",
            f"set {key} below {servers}, or give the rollout more GPUs (cluster.rollout.num_gpus)",
        )


def _split_problems(servers: list[tuple[str, dict, str, int]]) -> Iterator[Problem]:
    from slime.engine.vllm.engine_args import tensor_parallel_size

    for prefix, args, gpus_key, num_gpus in servers:
        if num_gpus <= 0:
            continue  # reported by the resource checks
        try:
            tensor_parallel_size(num_gpus, args)
        except ValueError as exc:
            yield Problem(
                prefix, args, f"{gpus_key}={num_gpus}: {exc}", f"pick parallel sizes whose product divides {gpus_key}"
            )


# ---------------------------------------------------------------------------------------------- megatron
def check_megatron_args(cfg: RunConfig) -> Iterator[Problem]:
    """parallelism.megatron and the megatron backend's own rules (slime.train.megatron.config_check)."""
    from slime.train.megatron.config_check import check_megatron

    yield from check_megatron(cfg)
