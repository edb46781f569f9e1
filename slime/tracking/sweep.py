"""The sweep's comparison plot: a Hydra callback (conf/config.yaml, hydra.callbacks.sweep_plot).

`on_multirun_end` runs in the process that launched the sweep once every job has returned, whatever
the launcher (basic, or the Ray Jobs launcher), so it reads what the jobs left in the sweep directory:
each job directory's metrics.jsonl, labelled by the job's overrides (`.hydra/overrides.yaml`, the
sweep's swept keys) or else by its directory name. Writes `<sweep dir>/sweep_rewards.png`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback

from slime.tracking.plot import plot_sweep_rewards

logger = logging.getLogger(__name__)


def job_label(job_dir: Path) -> str:
    overrides_file = job_dir / ".hydra" / "overrides.yaml"
    if overrides_file.exists():
        overrides = yaml.safe_load(overrides_file.read_text()) or []
        shown = [o for o in overrides if not str(o).startswith(("hydra.", "paths."))]
        if shown:
            return f"{job_dir.name}: " + " ".join(map(str, shown))
    return job_dir.name


def sweep_runs(sweep_dir: Path) -> dict[str, Path]:
    """label -> metrics.jsonl for every job directory under the sweep (any depth, job order)."""
    found = sorted(sweep_dir.rglob("metrics.jsonl"), key=lambda p: [int(s) if s.isdigit() else s for s in p.parts])
    return {job_label(path.parent): path for path in found}


def write_sweep_plot(sweep_dir: str | Path) -> Path | None:
    sweep_dir = Path(sweep_dir)
    runs = sweep_runs(sweep_dir)
    return plot_sweep_rewards(runs, sweep_dir / "sweep_rewards.png") if runs else None


class SweepPlot(Callback):
    """Writes the sweep's reward comparison when a multirun ends; a failure to plot never fails the sweep."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            path = write_sweep_plot(sweep_dir)
        except Exception as exc:  # a plot is a convenience: report, do not fail a finished sweep
            logger.warning("sweep plot not written: %s: %s", type(exc).__name__, exc)
            return
        if path is not None:
            print(f"Sweep comparison plot: {path}", flush=True)
