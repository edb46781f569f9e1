"""Import-path fields of the rollout: each is resolved and its call shape (slime/rollout/entry_points.py)
checked before anything starts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from slime.config.hooks import HookError, load_callable
from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.registry import ROLLOUT_FUNCTIONS, TOOL_PARSERS
from slime.rollout.agent.trajectory import ON_MISMATCH
from slime.rollout.agent.turn_samples import SAMPLES
from slime.rollout.entry_points import (
    AGENT_SHAPE,
    BUFFER_FILTER_SHAPE,
    FILTER_SHAPE,
    GENERATE_SHAPE,
    REWARD_POST_PROCESS_SHAPE,
    ROLLOUT_FN_SHAPE,
    SAMPLE_HOOK_SHAPE,
    agent_entrypoint_path,
    chat_template_text,
    function_path,
    rollout_function_path,
)

# (config key, shape, fix)
_HOOK_FIELDS = (
    (
        "rollout.generate_function",
        GENERATE_SHAPE,
        "give the import path of `async def generate(args, sample, sampling_params) -> Sample`, or null",
    ),
    (
        "algo.dynamic_filter",
        FILTER_SHAPE,
        "give the import path of `def fn(args, group: list[Sample]) -> bool | FilterResult`, or null",
    ),
    (
        "rollout.buffer_filter",
        BUFFER_FILTER_SHAPE,
        "give the import path of `def fn(args, rollout_id, buffer, num) -> list[list[Sample]]`, or null",
    ),
    (
        "rollout.reward_post_process",
        REWARD_POST_PROCESS_SHAPE,
        "give the import path of `def fn(args, samples) -> (raw_rewards, rewards)`, or null",
    ),
)


def check_full_async_hooks(cfg: RunConfig) -> Iterator[Problem]:
    """train.async=full generates group by group in its own stream (slime.rollout.stream), taking groups in
    start order: the default rollout function only, and no dynamic filter."""
    if not cfg.train.is_fully_async:
        return
    function = rollout_function_path(cfg)
    if function is not None and function != ROLLOUT_FUNCTIONS.target("default"):
        yield Problem(
            "rollout.function",
            cfg.rollout.function or cfg.algo.name,
            "train.async=full generates groups with its own stream (one group at a time, rollout.generate_function "
            "per sample); a custom rollout function runs whole steps",
            "drop rollout.function (customise rollout.generate_function instead), or set train.async=one_step",
        )
    if cfg.algo.dynamic_filter is not None:
        yield Problem(
            "algo.dynamic_filter",
            cfg.algo.dynamic_filter,
            "train.async=full takes groups as they finish; a filter that drops groups is not applied there",
            "drop algo.dynamic_filter, or set train.async=one_step",
        )


def check_hooks(cfg: RunConfig) -> Iterator[Problem]:
    yield from _check_function("rollout.function", cfg.rollout.function, rollout_function_path(cfg))
    if cfg.eval.function is not None:
        yield from _check_function("eval.function", cfg.eval.function, function_path(cfg.eval.function))
    for key, shape, fix in _HOOK_FIELDS:
        group, _, name = key.partition(".")
        spec = getattr(getattr(cfg, group), name)
        if spec is not None:
            yield from _check(key, spec, shape, fix)
    for i, spec in enumerate(cfg.rollout.sample_hooks):
        yield from _check(
            f"rollout.sample_hooks[{i}]",
            spec,
            SAMPLE_HOOK_SHAPE,
            "give the import path of `def hook(args, sample, *, rollout_id, evaluation) -> Sample | None`",
        )


def _check_function(key: str, spec: Any, path: Any) -> Iterator[Problem]:
    if path is None:
        yield Problem(
            key,
            spec,
            ROLLOUT_FUNCTIONS.unknown_message(spec),
            f"set {key} to a registered name, an import path module.fn, or null",
        )
        return
    yield from _check(
        key,
        path,
        ROLLOUT_FN_SHAPE,
        "give a registered name or the import path of `def fn(args, rollout_id, data_source, evaluation=False)`, "
        "or null",
    )


def _check(key: str, spec: Any, shape: dict[str, Any], fix: str) -> Iterator[Problem]:
    try:
        load_callable(spec, key=key, **shape)
    except HookError as exc:
        yield exc.problem(fix)


def check_agent(cfg: RunConfig) -> Iterator[Problem]:
    """`rollout.agent.*` when an entrypoint is set: it imports with its call shape, its tool parser is registered,
    and no generate function competes with it."""
    agent = cfg.rollout.agent
    if agent.entrypoint is None:
        return
    fix = "give the import path of `def run(base_url, api_key, record) -> float | None` (or async def), or null"
    yield from _check("rollout.agent.entrypoint", agent_entrypoint_path(agent.entrypoint), AGENT_SHAPE, fix)
    if agent.tool_parser not in TOOL_PARSERS:
        yield Problem(
            "rollout.agent.tool_parser",
            agent.tool_parser,
            TOOL_PARSERS.unknown_message(agent.tool_parser),
            f"set rollout.agent.tool_parser=<one of {', '.join(TOOL_PARSERS.names())}> (the model's tool-call form)",
        )
    if agent.chat_template is not None:
        try:
            chat_template_text(agent.chat_template)
        except ValueError as exc:
            yield Problem("rollout.agent.chat_template", agent.chat_template, str(exc), "give a .jinja file or null")
    if agent.on_mismatch not in ON_MISMATCH:
        rules = " or ".join(ON_MISMATCH)
        yield Problem("rollout.agent.on_mismatch", agent.on_mismatch, "unknown rule", f"set {rules}")
    if agent.samples not in SAMPLES:
        yield Problem("rollout.agent.samples", agent.samples, "unknown option", f"set {' or '.join(SAMPLES)}")
    if cfg.rollout.generate_function is not None:
        yield Problem(
            "rollout.generate_function",
            cfg.rollout.generate_function,
            "rollout.agent.entrypoint runs every sample as an agent episode; a generate function would never be called",
            "set rollout.generate_function=null, or rollout.agent.entrypoint=null",
        )
    for key, value in (("max_turns", agent.max_turns), ("timeout_s", agent.timeout_s)):
        if value <= 0:
            yield Problem(f"rollout.agent.{key}", value, "must be positive", f"set rollout.agent.{key} above 0")
