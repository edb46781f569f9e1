"""Validation of the sglang engine's config: the checks of its registry record (slime.registry.ENGINES), run by
slime/plan/validate.py before anything starts. sglang itself is never imported here (server_args reads the
pinned field list, or the installed wheel's version only).

    rollout.sglang     SGLang ServerArgs fields the framework does not own, with values SGLang's command line
                       carries (slime.engine.sglang.server_args); also every server group's `overrides`
    an installed sglang must be the version whose parser is recorded
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.engine.check import SGLANG_ROUTER, check_generating_health_timeout, check_router_args
from slime.engine.groups import group_overrides
from slime.engine.sglang.server_args import check_server_args, installed_version_issue


def check(cfg: RunConfig) -> Iterator[Problem]:
    """rollout.engine=sglang: the installed version, the server args, the router, the health-probe timeout."""
    issue = installed_version_issue()
    if issue is not None:
        yield Problem(issue.key, None, issue.message, issue.fix)
    for prefix, args in [("rollout.sglang", dict(cfg.rollout.sglang)), *group_overrides(cfg)]:
        yield from server_args_problems(prefix, args)
    yield from check_router_args(cfg, SGLANG_ROUTER)
    yield from check_generating_health_timeout(cfg)


def check_unchosen(cfg: RunConfig) -> Iterator[Problem]:
    """Another engine is chosen: `rollout.sglang` does nothing (its keys are still checked)."""
    yield from unused_server_args(cfg, [("rollout.sglang", dict(cfg.rollout.sglang))])


def unused_server_args(cfg: RunConfig, sources: list[tuple[str, dict[str, Any]]]) -> Iterator[Problem]:
    """SGLang server args set (under each `(key, args)` of `sources`) for an engine other than sglang."""
    for prefix, args in sources:
        if not args:
            continue
        yield Problem(
            prefix,
            args,
            f"SGLang server args do nothing with rollout.engine={cfg.rollout.engine}",
            "remove them or use the sglang engine (rollout=sglang)",
        )
        yield from server_args_problems(prefix, args)


def server_args_problems(prefix: str, args: dict[str, Any]) -> Iterator[Problem]:
    """`args` (the value of `prefix`) against SGLang's ServerArgs fields."""
    for issue in check_server_args(args, prefix=prefix):
        yield Problem(issue.key, args[issue.key.rpartition(".")[2]], issue.message, issue.fix)
