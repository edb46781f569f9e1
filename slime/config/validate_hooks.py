"""Import-path fields: each is resolved and its call shape checked before anything starts.

Call shapes (how the runtime calls them; `args` is the rollout's `RolloutContext`, slime's `args`):

    rollout.function           fn(args, rollout_id, data_source, evaluation=...)   plain def
    eval.function              as rollout.function (called with evaluation=True)
    rollout.generate_function  fn(args, sample, sampling_params)                   async def (or def)
    rollout.custom_rm_path     rm(args, sample) | rm(args, samples)               checked in validate_data.py
    algo.dynamic_filter        fn(args, group)                                     plain def
    rollout.buffer_filter      fn(args, rollout_id, buffer, num)                   plain def
    rollout.reward_post_process fn(args, samples)                                  plain def
    rollout.sample_hooks[i]    fn(args, sample, rollout_id=..., evaluation=...)    def or async def
    data.generator             fn(path=..., **rest)                                a `_target_` node
    eval.datasets.<name>.generator  as data.generator
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

from slime.config.hooks import HookError, load_callable
from slime.config.problems import Problem
from slime.config.schema import AlgoConfig, RunConfig
from slime.config.validate_eval import valid_eval_datasets
from slime.registry import ROLLOUT_FUNCTIONS

ROLLOUT_FN_SHAPE = dict(signature=("args", "rollout_id", "data_source"), keywords=("evaluation",), may_be_async=False)
GENERATE_SHAPE = dict(signature=("args", "sample", "sampling_params"), may_be_async=True)
FILTER_SHAPE = dict(signature=("args", "group"), may_be_async=False)
BUFFER_FILTER_SHAPE = dict(signature=("args", "rollout_id", "buffer", "num"), may_be_async=False)
REWARD_POST_PROCESS_SHAPE = dict(signature=("args", "samples"), may_be_async=False)
SAMPLE_HOOK_SHAPE = dict(signature=("args", "sample"), keywords=("rollout_id", "evaluation"), may_be_async=True)
GENERATOR_SHAPE = dict(signature=(), may_be_async=False)

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


def default_rollout_function(algo: AlgoConfig) -> str:
    """rollout.function=null: SFT reads its responses from the data ("sft"); every other algorithm generates."""
    return "sft" if algo.advantage_estimator == "sft" else "default"


def function_path(spec: Any) -> Any:
    """A registry name -> its import path; an import path or `_target_` node as given; None for an unknown name."""
    if isinstance(spec, str) and spec in ROLLOUT_FUNCTIONS:
        return ROLLOUT_FUNCTIONS.target(spec)
    if isinstance(spec, dict) or (isinstance(spec, str) and "." in spec):
        return spec
    return None


def rollout_function_path(cfg: RunConfig) -> Optional[Any]:
    """What `rollout.function` selects: a registry name, an import path (or node), or null (the algorithm's
    default), as an import path. None for an unknown registry name (reported by `check_hooks`)."""
    return function_path(cfg.rollout.function or default_rollout_function(cfg.algo))


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
    yield from check_generator("data.generator", cfg.data.generator)
    for name, dataset in valid_eval_datasets(cfg).items():
        yield from check_generator(f"eval.datasets.{name}.generator", dataset.generator)


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
