"""Reward hooks for the launcher's sweep test, called as rollout.custom_rm_path: rm(args, sample) -> float."""

from __future__ import annotations

from slime.rollout.rewards import first_word


def digit(args, sample) -> float:
    """The embedded task's reward (the first word of the response is the label)."""
    return first_word(sample.response, sample.label or "")


def unreachable(args, sample) -> float:
    """A reward service that is down: every sample fails its reward, so the run fails in its first rollout."""
    raise ConnectionError("reward service unreachable")
