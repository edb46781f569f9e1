"""One front for every sink: metrics.jsonl (ground truth), wandb, samples.jsonl and the progress bar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slime.config.schema import LoggerConfig
from slime.tracking.jsonl import JsonlWriter
from slime.tracking.plot import plot_reward_curve
from slime.tracking.progress import RunProgress
from slime.tracking.wandb_run import WandbRun


class Tracker:
    """Every metric sink of a run (metrics.jsonl, wandb, progress, samples, plot) behind one `log` call."""

    def __init__(
        self,
        cfg: LoggerConfig,
        *,
        run_dir: Path,
        config: dict[str, Any],
        name: str,
        total_rollouts: int,
        wandb_id: str | None = None,
    ):
        self.cfg = cfg
        self.run_dir = run_dir
        self.metrics = JsonlWriter(run_dir / "metrics.jsonl")
        self.samples = JsonlWriter(run_dir / "samples.jsonl")
        self.wandb = WandbRun(cfg.wandb, run_dir=run_dir, config=config, name=name, run_id=wandb_id)
        self.progress = RunProgress(total=total_rollouts, enabled=cfg.progress)  # shown from progress.begin(start)

    def log(self, metrics: dict[str, float], **steps: int) -> None:
        """Write one event; `steps` are its axes by short name, e.g. rollout=3 -> {"rollout/step": 3}."""
        record = {f"{axis}/step": value for axis, value in steps.items()}
        record.update(metrics)
        self.metrics.write(record)
        self.wandb.log(record)

    def log_samples(self, samples: list[dict[str, Any]]) -> None:
        for sample in samples[: self.cfg.log_samples]:
            self.samples.write(sample)

    def finish(self, exit_code: int) -> Path | None:
        """Close every sink; plot the reward curve. Returns the PNG path if one was written."""
        self.progress.close()
        self.metrics.close()
        self.samples.close()
        self.wandb.finish(exit_code)
        if self.cfg.plot:
            return plot_reward_curve(self.run_dir / "metrics.jsonl", self.run_dir / "reward_curve.png")
        return None
