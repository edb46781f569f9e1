"""One front for every sink: metrics.jsonl (ground truth), wandb, TensorBoard, samples.jsonl, plots (the console's
progress display follows the run's events instead: slime/driver/console.py).

Every sink gets the same record under the same names; metrics.jsonl holds every number logged anywhere.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from slime.config.schema import LoggerConfig
from slime.tracking import continuity
from slime.tracking.jsonl import JsonlWriter
from slime.tracking.naming import RunIdentity, store_run_id
from slime.tracking.plot import write_run_plots
from slime.tracking.wandb_run import WandbRun

logger = logging.getLogger(__name__)


class Tracker:
    """Every metric sink of a run behind one `log` call.

    `config` is the redacted resolved config (plus the env report under `env`); `identity` names the run
    (slime.tracking.naming); `steps_per_rollout` (K) maps records to wandb's step.
    """

    def __init__(
        self,
        cfg: LoggerConfig,
        *,
        run_dir: Path,
        config: dict[str, Any],
        identity: RunIdentity,
        steps_per_rollout: int,
    ):
        self.cfg = cfg
        self.run_dir = run_dir
        self.identity = identity
        self.steps_per_rollout = steps_per_rollout
        run_dir.mkdir(parents=True, exist_ok=True)
        if "env" in config:
            (run_dir / "env.json").write_text(json.dumps(config["env"], indent=2))
        self.metrics = JsonlWriter(run_dir / "metrics.jsonl")
        self.samples = JsonlWriter(run_dir / "samples.jsonl")
        self.tensorboard = None
        if cfg.tensorboard:
            # optional library: tensorboard (`pip install .[tensorboard]`), loaded only when logger.tensorboard=true
            from slime.tracking.tensorboard import TensorBoardSink

            self.tensorboard = TensorBoardSink(run_dir)
        self.wandb = WandbRun(
            cfg.wandb, run_dir=run_dir, config=config, identity=identity, steps_per_rollout=steps_per_rollout
        )

    def log(self, metrics: dict[str, float], **steps: int) -> None:
        """Write one event; `steps` are its axes by short name, e.g. rollout=3 -> {"rollout/step": 3}."""
        record = {f"{axis}/step": value for axis, value in steps.items()}
        record.update(metrics)
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        self.wandb.log(record)
        if self.tensorboard is not None:
            self.tensorboard.log(record)

    def step_records(self, rollout_id: int, steps: list[dict[str, float]], metrics: dict[str, float]) -> list[dict]:
        """A rollout's records as logged: one per optimizer step (train/step), then the rollout's own."""
        k = self.steps_per_rollout
        records = [{"rollout/step": rollout_id, "train/step": rollout_id * k + i, **m} for i, m in enumerate(steps)]
        return [*records, {"rollout/step": rollout_id, **metrics}]

    def log_step(self, rollout_id: int, steps: list[dict[str, float]], metrics: dict[str, float]) -> None:
        for record in self.step_records(rollout_id, steps, metrics):
            self._write(record)

    def stage_step(self, root: str, rollout_id: int, steps: list[dict[str, float]], metrics: dict[str, float]) -> None:
        """Before rollout `rollout_id`'s checkpoint is saved: its records go with it (slime.tracking.continuity)."""
        continuity.stage(root, rollout_id, self.step_records(rollout_id, steps, metrics), run_dir=self.run_dir)

    def resume(self, root: str, start: int) -> None:
        """The run continues at rollout `start` from the checkpoint under `root`: metrics.jsonl and
        samples.jsonl are cut back to the checkpoint, and the checkpoint's staged records of rollout start-1 are
        logged if missing."""
        self.metrics.close()
        self.samples.close()
        missing = continuity.reconcile(self.metrics.path, root, start, self.steps_per_rollout)
        continuity.cut_samples(self.samples.path, start)
        self.metrics = JsonlWriter(self.metrics.path)
        self.samples = JsonlWriter(self.samples.path)
        if missing:
            logger.info("logging the %d records of rollout %d kept with its checkpoint", len(missing), start - 1)
        for record in missing:
            self._write(record)

    def has_eval(self, eval_step: int) -> bool:
        return continuity.has_eval(self.metrics.path, eval_step)

    def log_samples(self, rollout_id: int, samples: list[dict[str, Any]]) -> None:
        """samples.jsonl every rollout; a wandb table every `logger.log_samples_every` rollouts."""
        for sample in samples[: self.cfg.log_samples]:
            self.samples.write(sample)
        every = self.cfg.log_samples_every
        if every and rollout_id % every == 0:
            self.wandb.log_samples(rollout_id, samples[: self.cfg.log_samples])

    def on_save(self, checkpoint_root: str, *, plot: bool = True) -> None:
        """A checkpoint was written: keep the run id with it (a resume continues this run) and refresh the plots."""
        store_run_id(checkpoint_root, self.identity)
        if plot:
            self.plot()

    def plot(self) -> list[Path]:
        """The run's PNGs (slime.tracking.plot); a plot that fails is logged, never fails the run."""
        if not self.cfg.plot:
            return []

        try:
            return write_run_plots(self.run_dir / "metrics.jsonl", self.run_dir)
        except Exception as exc:
            logger.warning("plots not written: %s: %s", type(exc).__name__, exc)
            return []

    def finish(self, exit_code: int) -> dict[str, str]:
        """Close every sink and write the plots. Returns where the outputs are (name -> path or command)."""
        self.metrics.close()
        self.samples.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        sync = self.wandb.sync_command()
        wandb_dir = self.wandb.run_dir
        self.wandb.finish(exit_code)
        outputs = {f"plot:{p.stem}": str(p) for p in self.plot()}
        if wandb_dir:
            outputs["wandb"] = wandb_dir
        if sync:
            outputs["wandb_sync"] = sync
        if self.tensorboard is not None:
            outputs["tensorboard"] = f"tensorboard --logdir {self.tensorboard.log_dir}"
        return outputs
