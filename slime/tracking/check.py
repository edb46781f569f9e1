"""Validation of the run's sinks: the logger's packages are installed (found at start-up, not after the cluster
has started). Run by slime/plan/validate.py; no wandb or tensorboard import (find_spec only)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.tracking.wandb_mode import resolve_mode


def check_sinks(cfg: RunConfig) -> Iterator[Problem]:
    """The logger's packages are installed (found at start-up, not after the cluster has started)."""
    resolved = resolve_mode(cfg.logger.wandb)
    if resolved != "disabled" and importlib.util.find_spec("wandb") is None:
        yield Problem(
            "logger.wandb.mode",
            cfg.logger.wandb.mode,
            f"logs to wandb ({resolved}), but the wandb package is not installed",
            "pip install wandb, or set logger.wandb.mode=disabled",
        )
    if cfg.logger.tensorboard and importlib.util.find_spec("tensorboard") is None:
        yield Problem(
            "logger.tensorboard",
            True,
            "writes TensorBoard event files, but the tensorboard package is not installed",
            "pip install '.[tensorboard]', or set logger.tensorboard=false",
        )
