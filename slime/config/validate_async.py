"""The one-step-async loop (`train.async`, REFERENCE.md §2.4) and the weight-sync interval it brings."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.schema import RunConfig


def check_async(cfg: RunConfig) -> Iterator[Problem]:
    interval = cfg.rollout.weight_sync.interval
    if interval < 1:
        yield Problem(
            "rollout.weight_sync.interval",
            interval,
            "must be >= 1 (rollout steps between weight syncs)",
            "set rollout.weight_sync.interval=1",
        )
    elif interval > 1 and not cfg.train.is_async:
        yield Problem(
            "rollout.weight_sync.interval",
            interval,
            "only the one-step-async loop skips weight syncs; the synchronous loop syncs after every rollout step",
            "set train.async=true, or rollout.weight_sync.interval=1",
        )
    if cfg.train.is_async and cfg.cluster.colocate:
        yield Problem(
            "train.async",
            True,
            "the one-step-async loop generates rollout k+1 while step k trains, so engines and trainers need "
            "GPUs of their own, but cluster.colocate=true puts them on the same GPUs",
            "set cluster.colocate=false (cluster.actor and cluster.rollout then get separate GPUs), "
            "or train.async=false",
        )
    without_half = [
        key
        for key, on in (("debug.rollout_only", cfg.debug.rollout_only), ("debug.train_only", cfg.debug.train_only))
        if on
    ]
    if cfg.train.is_async and (without_half or cfg.debug.load_rollout_data):
        key = without_half[0] if without_half else "debug.load_rollout_data"
        yield Problem(
            "train.async",
            True,
            f"the one-step-async loop overlaps generation with training, and {key} runs only one of them",
            f"set train.async=false, or drop {key}",
        )
