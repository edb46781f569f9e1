"""Eval metrics per named dataset (docs/data-and-rewards.md#eval): mean reward, truncation, length and pass@k."""

from __future__ import annotations

import statistics

from slime.algo.passk import pass_at_k
from slime.types import Sample, SampleStatus


def eval_metrics(name: str, groups: list[list[Sample]], reward_key: str | None) -> dict[str, float]:
    """`eval/<name>` (mean scalar reward), `eval/<name>/truncated_ratio`, `eval/<name>/response_len/mean` (tokens)
    and the unbiased `eval/<name>/pass@k` for k = 1, 2, 4, ... up to the group size n.

    A sample counts as correct for pass@k when its scalar reward (`reward_key` picks it from a dict reward)
    is exactly 1. `groups` holds every prompt's n samples.
    """
    samples = [s for g in groups for s in g]
    if not samples:
        raise ValueError(f"eval dataset {name!r} produced no samples")
    rewards = [s.scalar_reward(reward_key) for s in samples]
    metrics = {
        f"eval/{name}": statistics.fmean(rewards),
        f"eval/{name}/truncated_ratio": statistics.fmean(s.status == SampleStatus.TRUNCATED for s in samples),
        f"eval/{name}/response_len/mean": statistics.fmean(s.effective_response_length for s in samples),
    }
    n = min(len(g) for g in groups)
    k = 1
    while k <= n:
        metrics[f"eval/{name}/pass@{k}"] = statistics.fmean(
            pass_at_k(len(g), sum(s.scalar_reward(reward_key) == 1 for s in g), k) for g in groups
        )
        k *= 2
    return metrics
