"""The wandb run: modes online / offline / disabled / auto (offline unless an API key is configured).

Naming and the run id come from slime.tracking.naming; with an id the run is opened with
`resume="allow"`, so a run resumed from its checkpoint continues the same wandb run. wandb's own step
(`_step`) is the optimizer step a record belongs to (`optimizer_step`), a function of the record's
axes: a resumed run logs after the last step its checkpoint covered, never over it, online or
offline-then-synced (`slime.tracking.step_axes`). Charts use the declared axes (`STEP_AXES`); the mode rule is
`slime.tracking.wandb_mode` (validation reads it without loading wandb). Secrets: wandb's own metadata
capture (which records the command line) is off; the env report replaces it, redacted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slime.config.schema import WandbConfig
from slime.tracking.step_axes import STEP_AXES, optimizer_step
from slime.tracking.wandb_mode import resolve_mode


def _wandb():
    """The wandb module, imported only for a run that logs to it."""
    import wandb  # optional library: a minimal GPU image may lack it, and logger.wandb.mode=disabled runs without it

    return wandb


SAMPLE_COLUMNS = (
    "rollout_step",
    "index",
    "group_index",
    "prompt",
    "response",
    "label",
    "reward",
    "response_length",
    "status",
    "weight_version",
)


class WandbRun:
    """A thin owner of one wandb run; every call is a no-op when the mode is disabled.

    `identity` is a slime.tracking.naming.RunIdentity; `config` the redacted resolved config.
    """

    def __init__(self, cfg: WandbConfig, *, run_dir: Path, config: dict[str, Any], identity, steps_per_rollout: int):
        self.mode = resolve_mode(cfg)
        self.steps_per_rollout = steps_per_rollout
        self.run = None
        self.run_dir: str | None = None
        if self.mode == "disabled":
            return

        self.run = _wandb().init(
            project=identity.project,
            entity=identity.entity,
            group=identity.group,
            name=identity.name,
            tags=identity.tags,
            notes=identity.notes,
            job_type=identity.job_type,
            config=config,
            dir=str(run_dir),
            mode=self.mode,
            id=identity.id,
            resume="allow",
            settings=_wandb().Settings(console="off", silent=True, x_disable_meta=True, disable_git=True),
        )
        self.run_dir = str(Path(self.run.dir).parent)
        for axis in sorted(set(STEP_AXES.values())):
            self.run.define_metric(axis)
        for pattern, axis in STEP_AXES.items():
            self.run.define_metric(pattern, step_metric=axis)

    @property
    def run_id(self) -> str | None:
        return self.run.id if self.run is not None else None

    def log(self, record: dict[str, float]) -> None:
        if self.run is not None:
            self.run.log(record, step=optimizer_step(record, self.steps_per_rollout))

    def log_samples(self, rollout_id: int, samples: list[dict[str, Any]]) -> None:
        """A fresh table per log (re-logging a growing table hits wandb#2981), under `rollout/samples`."""
        if self.run is None or not samples:
            return

        table = _wandb().Table(columns=list(SAMPLE_COLUMNS), data=[_row(s) for s in samples])
        self.log({"rollout/step": rollout_id, "rollout/samples": table})

    def sync_command(self) -> str | None:
        """The command that uploads an offline run (None unless offline)."""
        return f"wandb sync {self.run_dir}" if self.mode == "offline" and self.run_dir else None

    def finish(self, exit_code: int = 0) -> None:
        """Finish the run and wait until its files are complete: `run.finish()` returns while wandb's service
        may still be writing the offline run (measured: a 7-byte .wandb file right after it); `wandb.teardown()`
        waits for the service to flush and exit, before a run's process exits without finalisation."""
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None
            _wandb().teardown()


def _row(sample: dict[str, Any]) -> list[Any]:
    """A sample (Sample.to_dict()) as a table row: the last weight version it was generated under; chat
    prompts and dict rewards as text."""
    values = {**sample, "weight_version": (sample.get("weight_versions") or [None])[-1]}
    return [v if isinstance(v, int | float | str) or v is None else str(v) for v in map(values.get, SAMPLE_COLUMNS)]
