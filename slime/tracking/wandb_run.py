"""wandb with modes online / offline / disabled / auto (offline unless an API key is configured)."""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any

from slime.config.schema import WandbConfig

# Step axes (REFERENCE.md §11): each metric family is plotted against its own counter.
STEP_AXES = {"train/*": "train/step", "rollout/*": "rollout/step", "perf/*": "rollout/step", "eval/*": "eval/step"}


def resolve_mode(cfg: WandbConfig) -> str:
    """auto -> WANDB_MODE if set, else online with an API key (env or ~/.netrc), else offline."""
    if cfg.mode != "auto":
        return cfg.mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if _has_api_key() else "offline"


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


class WandbRun:
    """A thin owner of one wandb run; every call is a no-op when the mode is disabled."""

    def __init__(self, cfg: WandbConfig, *, run_dir: Path, config: dict[str, Any], name: str, run_id: str | None):
        self.mode = resolve_mode(cfg)
        self.run = None
        if self.mode == "disabled":
            return
        import wandb

        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            group=cfg.group,
            name=cfg.name or name,
            tags=list(cfg.tags),
            config=config,
            dir=str(run_dir),
            mode=self.mode,
            id=run_id,
            resume="allow" if run_id else None,
            settings=wandb.Settings(console="off", silent=True),
        )
        for axis in set(STEP_AXES.values()):
            self.run.define_metric(axis)
        for pattern, axis in STEP_AXES.items():
            self.run.define_metric(pattern, step_metric=axis)

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run is not None else None

    def log(self, metrics: dict[str, float]) -> None:
        if self.run is not None:
            self.run.log(metrics)

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None
