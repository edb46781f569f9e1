"""Dynamic sampling filters (`algo.dynamic_filter`): decide per finished group whether to keep it.

A filter is `fn(group: list[Sample]) -> bool | FilterResult`; a dropped group is counted as
`rollout/dynamic_filter/drop_<reason>` and replaced by over-sampling (REFERENCE.md §6.3).
"""

from __future__ import annotations

import dataclasses
import statistics

from slime.types import Sample


@dataclasses.dataclass(frozen=True)
class FilterResult:
    """A dynamic filter's verdict on one group: keep it, or drop it with a reason (counted in the metrics)."""

    keep: bool
    reason: str | None = None


def _reward(sample: Sample) -> float:
    reward = sample.reward
    if isinstance(reward, dict):
        reward = reward.get("score", next(iter(reward.values())))
    return float(reward)


def check_reward_nonzero_std(group: list[Sample]) -> FilterResult:
    """DAPO: keep a group only if its rewards differ (unbiased std > 1e-6); reason `zero_std_<reward>`."""
    rewards = [_reward(s) for s in group]
    if len(rewards) > 1 and statistics.stdev(rewards) > 1e-6:
        return FilterResult(True)
    return FilterResult(False, f"zero_std_{round(rewards[0], 1)}")
