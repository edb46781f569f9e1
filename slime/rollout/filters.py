"""Dynamic sampling filters (`algo.dynamic_filter`): decide per finished group whether to keep it.

A filter is `fn(args, group: list[Sample]) -> bool | FilterResult` (`args`: the RolloutContext); a
dropped group is counted as `rollout/dynamic_filter/drop_<reason>` and replaced by over-sampling
(docs/data-and-rewards.md#dynamic-filters).
"""

from __future__ import annotations

import dataclasses
import statistics

from slime.types import Sample


@dataclasses.dataclass(frozen=True)
class FilterResult:
    """A dynamic filter's verdict on one group: keep it, or drop it with a reason (counted in the metrics).

    `keep_when_insufficient`: keep a rejected group anyway when dropping it would force another
    over-sampling round (the groups kept and in flight would no longer fill the batch).
    """

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


def check_reward_nonzero_std(args, group: list[Sample]) -> FilterResult:
    """DAPO: keep a group only if its rewards differ (unbiased std > 1e-6); reason `zero_std_<reward>`."""
    rewards = [s.scalar_reward(args.reward_key) for s in group]
    if len(rewards) > 1 and statistics.stdev(rewards) > 1e-6:
        return FilterResult(True)
    return FilterResult(False, f"zero_std_{round(rewards[0], 1)}")


def zero_std_filter_with_fallback(args, group: list[Sample]) -> FilterResult:
    """The DAPO filter, but a rejected group is kept when dropping it would need another over-sampling round."""
    return dataclasses.replace(check_reward_nonzero_std(args, group), keep_when_insufficient=True)
