"""The asynchronous loops (`train.async`: one_step and full, docs/training-loops.md) and the keys they bring: the
weight-sync interval, the staleness bound and what a stale group gets."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.async_mode import AsyncMode, PauseMode, StalePolicy
from slime.config.problems import Problem, one_of
from slime.config.schema import RunConfig


def check_async(cfg: RunConfig) -> Iterator[Problem]:
    try:
        mode = AsyncMode.parse(getattr(cfg.train, "async"))
    except ValueError as exc:
        yield Problem("train.async", getattr(cfg.train, "async"), str(exc), "set train.async=off, one_step or full")
        return
    yield from _check_interval(cfg, mode)
    yield from _check_pause(cfg, mode)
    if mode is AsyncMode.OFF:
        return
    if cfg.cluster.colocate:
        yield Problem(
            "train.async",
            getattr(cfg.train, "async"),
            "the asynchronous loops generate while the trainer trains, so engines and trainers need GPUs of their "
            "own, but cluster.colocate=true puts them on the same GPUs",
            "set cluster.colocate=false (cluster.actor and cluster.rollout then get separate GPUs), or train.async=off",
        )
    without_half = [
        key
        for key, on in (("debug.rollout_only", cfg.debug.rollout_only), ("debug.train_only", cfg.debug.train_only))
        if on
    ]
    if without_half or cfg.debug.load_rollout_data:
        key = without_half[0] if without_half else "debug.load_rollout_data"
        yield Problem(
            "train.async",
            getattr(cfg.train, "async"),
            f"the asynchronous loops overlap generation with training, and {key} runs only one of them",
            f"set train.async=off, or drop {key}",
        )
    if mode is AsyncMode.FULL:
        yield from _check_full(cfg)


def _check_pause(cfg: RunConfig, mode: AsyncMode) -> Iterator[Problem]:
    value = cfg.rollout.weight_sync.pause_mode
    try:
        pause = PauseMode.resolve(value, mode)
    except ValueError as exc:
        yield Problem("rollout.weight_sync.pause_mode", value, str(exc), "set it to abort or in_place, or drop it")
        return
    if pause is not PauseMode.IN_PLACE:
        return
    conflicts = (
        (cfg.cluster.colocate, "cluster.colocate=true", "a colocated engine releases its memory for training"),
        (cfg.model.lora.synced_alone, "model.lora synced alone", "an adapter push unloads the held requests' adapter"),
    )
    for on, setting, why in conflicts:
        if on:
            yield Problem(
                "rollout.weight_sync.pause_mode",
                value,
                f"in_place holds running requests across a push, but with {setting} {why}",
                "set rollout.weight_sync.pause_mode=abort",
            )


def _check_interval(cfg: RunConfig, mode: AsyncMode) -> Iterator[Problem]:
    interval = cfg.rollout.weight_sync.interval
    if interval < 1:
        yield Problem(
            "rollout.weight_sync.interval",
            interval,
            "must be >= 1 (rollout steps between weight syncs)",
            "set rollout.weight_sync.interval=1",
        )
    elif interval > 1 and mode is not AsyncMode.ONE_STEP:
        yield Problem(
            "rollout.weight_sync.interval",
            interval,
            f"only the one-step-async loop skips weight syncs; train.async={mode.value} syncs after every step "
            "(with full, train.max_staleness bounds how old a trained sample's policy may be)",
            "set rollout.weight_sync.interval=1, or train.async=one_step",
        )


def _check_full(cfg: RunConfig) -> Iterator[Problem]:
    """train.async=full: a staleness bound of at least one version (the rollout function and the filter it allows:
    slime.rollout.check_hooks.check_full_async_hooks)."""
    if cfg.train.max_staleness < 1:
        yield Problem(
            "train.max_staleness",
            cfg.train.max_staleness,
            "must be >= 1 with train.async=full (0 allows only the current weights: the synchronous loop)",
            "set train.max_staleness=1, or train.async=off",
        )
    yield from one_of("rollout.stale_policy", cfg.rollout.stale_policy, [p.value for p in StalePolicy])
