"""The rollout's extension points: how the code that calls each one calls it, and which rollout function a
config selects. Validation (slime/rollout/check_hooks.py) loads every configured one with its shape.

Call shapes (`args` is the rollout's `RolloutContext`, slime's `args`):

    rollout.function           fn(args, rollout_id, data_source, evaluation=...)   plain def (the rollout manager)
    eval.function              as rollout.function (called with evaluation=True)
    rollout.generate_function  fn(args, sample, sampling_params)                   async def (or def)
    rollout.custom_rm_path     rm(args, sample) | rm(args, samples)               slime/rollout/rewards.py
    algo.dynamic_filter        fn(args, group)                                     plain def
    rollout.buffer_filter      fn(args, rollout_id, buffer, num)                   plain def
    rollout.reward_post_process fn(args, samples)                                  plain def
    rollout.sample_hooks[i]    fn(args, sample, rollout_id=..., evaluation=...)    def or async def
    rollout.agent.entrypoint   fn(base_url, api_key, record)                       def or async def (docs/agents.md)
    data.generator             fn(path=..., **rest), a `_target_` node              slime/assets/generators.py
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Optional

from slime.algo.estimators import ESTIMATORS
from slime.config.schema import AlgoConfig, RunConfig
from slime.registry import ROLLOUT_FUNCTIONS

ROLLOUT_FN_SHAPE = dict(signature=("args", "rollout_id", "data_source"), keywords=("evaluation",), may_be_async=False)
GENERATE_SHAPE = dict(signature=("args", "sample", "sampling_params"), may_be_async=True)
FILTER_SHAPE = dict(signature=("args", "group"), may_be_async=False)
BUFFER_FILTER_SHAPE = dict(signature=("args", "rollout_id", "buffer", "num"), may_be_async=False)
REWARD_POST_PROCESS_SHAPE = dict(signature=("args", "samples"), may_be_async=False)
AGENT_SHAPE = dict(signature=("base_url", "api_key", "record"), may_be_async=True)
SAMPLE_HOOK_SHAPE = dict(signature=("args", "sample"), keywords=("rollout_id", "evaluation"), may_be_async=True)


def default_rollout_function(algo: AlgoConfig) -> str:
    """rollout.function=null: the estimator's own (SFT reads its responses from the data: "sft"; every other
    algorithm generates: "default"); "default" for an unknown estimator, which validation reports."""
    estimator = ESTIMATORS.find(algo.advantage_estimator)
    return estimator.rollout_function if estimator is not None else "default"


def function_path(spec: Any) -> Any:
    """A registry name -> its import path; an import path or `_target_` node as given; None for an unknown name."""
    if isinstance(spec, str) and spec in ROLLOUT_FUNCTIONS:
        return ROLLOUT_FUNCTIONS.target(spec)
    if isinstance(spec, dict) or (isinstance(spec, str) and "." in spec):
        return spec
    return None


def rollout_function_path(cfg: RunConfig) -> Optional[Any]:
    """What `rollout.function` selects: a registry name, an import path (or node), or null (the algorithm's
    default), as an import path. None for an unknown registry name (reported by slime/rollout/check_hooks.py)."""
    return function_path(cfg.rollout.function or default_rollout_function(cfg.algo))


def agent_entrypoint_path(spec: Any) -> Any:
    """`package.module:function` (the form agent frameworks print) as the import path `package.module.function`."""
    if isinstance(spec, str) and spec.count(":") == 1:
        return spec.replace(":", ".")
    return spec


def chat_template_text(spec: str) -> str:
    """`rollout.agent.chat_template`: a Jinja file's text, or the string an import path names
    (`slime.assets.chat_templates.CHATML_TOOLS`). ValueError saying which it is not."""
    path = Path(spec)
    if path.suffix in (".jinja", ".j2", ".txt") or path.is_file():
        if not path.is_file():
            raise ValueError(f"no such chat template file: {spec}")
        return path.read_text()
    module_name, _, attr = spec.rpartition(".")
    try:
        value = getattr(importlib.import_module(module_name), attr) if module_name else None
    except ImportError as exc:
        raise ValueError(f"{spec!r} is neither a file nor an importable module.NAME ({exc})") from exc
    if not isinstance(value, str):
        raise ValueError(f"{spec!r} names no template string (a .jinja file, or an import path of a str)")
    return value
