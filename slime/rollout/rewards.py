"""Built-in rule-based rewards (`rollout.rm_type`) and the reward dispatch for one sample.

A reward function is `async def rm(sample) -> float | dict`; `rollout.custom_rm_path` names one. The
built-in `rm_type`s are `fn(response, label) -> float`, registered in `slime.registry.REWARD_TYPES`.
Selection order (REFERENCE.md §6.5): per-sample `metadata.custom_rm_path` -> global custom path ->
`metadata.rm_type` -> global `rollout.rm_type`.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from slime.config.hooks import load_callable
from slime.registry import REWARD_TYPES
from slime.types import Sample


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def exact_match(response: str, label: str) -> float:
    """1.0 iff the whitespace-normalised, lower-cased response equals the label."""
    return float(_normalize(response) == _normalize(label))


def first_word(response: str, label: str) -> float:
    """1.0 iff the first whitespace-separated word of the response equals the label (case-insensitive)."""
    words = _normalize(response).split(" ")
    return float(bool(words) and words[0] == _normalize(label))


async def compute_reward(sample: Sample, *, rm_type: str | None, custom_rm_path: str | None) -> float | dict[str, Any]:
    """Reward one finished sample with the function its metadata or the config selects."""
    custom = sample.metadata.get("custom_rm_path") or custom_rm_path
    if custom:
        result = load_callable(custom, key="rollout.custom_rm_path")(sample)
        return await result if inspect.isawaitable(result) else result
    name = sample.metadata.get("rm_type") or rm_type
    if name not in REWARD_TYPES:
        raise ValueError(f"sample {sample.index}: {REWARD_TYPES.unknown_message(name)}")
    if sample.label is None:
        raise ValueError(f"sample {sample.index} has no label; rm_type={name!r} compares the response with the label")
    return REWARD_TYPES.load(name)(sample.response, str(sample.label))
