"""Import-path fields: each is resolved and its call shape checked before anything starts.

Call shapes (how the runtime calls them):

    rollout.function      fn(ctx, rollout_id, evaluation=...)   plain def (slime.rollout.default.generate_rollout)
    rollout.custom_rm_path rm(args, sample) | rm(args, samples)  def or async def (validate_data.py)
    algo.dynamic_filter   fn(group)                              plain def (slime.rollout.filters)
    data.generator        fn(path=..., **rest)                   a `_target_` node; everything bound in the node
    eval.generator        as data.generator
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

from slime.config.hooks import HookError, load_callable
from slime.config.problems import Problem
from slime.config.schema import AlgoConfig, RunConfig
from slime.registry import ROLLOUT_FUNCTIONS

ROLLOUT_FN_SHAPE = dict(signature=("ctx", "rollout_id"), keywords=("evaluation",), may_be_async=False)
FILTER_SHAPE = dict(signature=("group",), may_be_async=False)
GENERATOR_SHAPE = dict(signature=(), may_be_async=False)


def default_rollout_function(algo: AlgoConfig) -> str:
    """rollout.function=null: SFT reads its responses from the data ("sft"); every other algorithm generates."""
    return "sft" if algo.advantage_estimator == "sft" else "default"


def rollout_function_path(cfg: RunConfig) -> Optional[str]:
    """The import path `rollout.function` selects: a registry name, an import path, or null (the algorithm's
    default). None for an unknown registry name (reported by `check_hooks`)."""
    spec = cfg.rollout.function or default_rollout_function(cfg.algo)
    if spec in ROLLOUT_FUNCTIONS:
        return ROLLOUT_FUNCTIONS.target(spec)
    return spec if "." in spec else None


def check_hooks(cfg: RunConfig) -> Iterator[Problem]:
    yield from _check_rollout_function(cfg)
    a = cfg.algo  # rollout.custom_rm_path: validate_data (its shape depends on rollout.group_rm)
    if a.dynamic_filter is not None:
        yield from _check(
            "algo.dynamic_filter",
            a.dynamic_filter,
            FILTER_SHAPE,
            "give the import path of `def fn(group: list[Sample]) -> bool | FilterResult`, or null",
        )
    yield from check_generator("data.generator", cfg.data.generator)
    yield from check_generator("eval.generator", cfg.eval.generator)


def _check_rollout_function(cfg: RunConfig) -> Iterator[Problem]:
    spec = cfg.rollout.function
    path = rollout_function_path(cfg)
    if path is None:
        yield Problem(
            "rollout.function",
            spec,
            ROLLOUT_FUNCTIONS.unknown_message(spec),
            "set rollout.function to a registered name, an import path module.fn, or null",
        )
        return
    yield from _check(
        "rollout.function",
        path,
        ROLLOUT_FN_SHAPE,
        "give a registered name or the import path of `def fn(ctx, rollout_id, *, evaluation)`, or null",
    )


def check_generator(key: str, generator: Any) -> Iterator[Problem]:
    """A generator is a `_target_` node that names its output file in `path`."""
    if generator is None:
        return
    if not isinstance(generator, dict) or not isinstance(generator.get("_target_"), str):
        yield Problem(
            key,
            generator,
            "expected a node {_target_: module.fn, path: <file>, ...}",
            f"set {key}._target_ and {key}.path, or {key}=null",
        )
        return
    if not isinstance(generator.get("path"), str):
        yield Problem(
            f"{key}.path",
            generator.get("path"),
            "a generator names the one file it writes",
            f"set {key}.path=<file> (and point prompt_data at it)",
        )
        return
    yield from _check(
        key,
        generator,
        GENERATOR_SHAPE,
        "give a node whose _target_ is importable and whose keys are its parameters, or null",
    )


def _check(key: str, spec: Any, shape: dict[str, Any], fix: str) -> Iterator[Problem]:
    try:
        load_callable(spec, key=key, **shape)
    except HookError as exc:
        yield Problem(exc.key, exc.value, exc.message, fix)
