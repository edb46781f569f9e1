"""What a sweep leaves when it ends: a Hydra callback (conf/config.yaml, hydra.callbacks.sweep_summary).

`on_multirun_end` runs in the process that launched the sweep once every job has returned, whatever the launcher
(basic, or the Ray Jobs launcher), so it reads what the jobs left in the sweep directory (slime/tracking/
sweep_table.py): it prints the sweep table (one row per run, the best marked) and writes it to
`<sweep dir>/sweep_summary.md`, and draws every run's reward curve into `<sweep dir>/sweep_rewards.png`, each
labelled by the overrides that tell it apart from the other runs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from slime.tracking.plot import plot_sweep_rewards
from slime.tracking.sweep_table import (
    differing_keys,
    find_runs,
    render_markdown,
    render_text,
    run_label,
    table_rows,
)

logger = logging.getLogger(__name__)
SUMMARY_FILE, PLOT_FILE = "sweep_summary.md", "sweep_rewards.png"


def sweep_runs(sweep_dir: Path) -> dict[str, Path]:
    """label -> metrics.jsonl for every job that logged metrics, in job order; a label names the job and only the
    overrides that differ between the sweep's runs."""
    runs = find_runs(sweep_dir)
    keys = differing_keys(runs)
    return {
        run_label(run, keys): run.job_dir / "metrics.jsonl" for run in runs if (run.job_dir / "metrics.jsonl").exists()
    }


def write_sweep_plot(sweep_dir: str | Path) -> Path | None:
    sweep_dir = Path(sweep_dir)
    runs = sweep_runs(sweep_dir)
    return plot_sweep_rewards(runs, sweep_dir / PLOT_FILE) if runs else None


def write_sweep_table(sweep_dir: str | Path, *, maximize: bool = True) -> str | None:
    """The table as text (None without a job); `<sweep dir>/sweep_summary.md` holds it as Markdown."""
    sweep_dir = Path(sweep_dir)
    runs = find_runs(sweep_dir)
    if not runs:
        return None
    header, rows = table_rows(runs, maximize=maximize)
    title = f"Sweep {sweep_dir}: {len(runs)} runs ({'highest' if maximize else 'lowest'} objective is best)"
    (sweep_dir / SUMMARY_FILE).write_text(render_markdown(header, rows, title=title))
    return f"{title}\n{render_text(header, rows)}"


def _maximizes(config: Any) -> bool:
    """Optuna's `hydra.sweeper.direction` when set (minimize/maximize); otherwise higher is better (rewards)."""
    direction = OmegaConf.select(config, "hydra.sweeper.direction", default="maximize")
    if OmegaConf.is_list(direction) or isinstance(direction, list):
        direction = direction[0]
    return str(direction).lower() != "minimize"


def _attempt(what: str, write) -> Any:
    """`write()`, or None with a warning when it raised: a convenience never fails a finished sweep."""
    try:
        return write()
    except Exception as exc:
        logger.warning("sweep %s not written: %s: %s", what, type(exc).__name__, exc)
        return None


class SweepSummary(Callback):
    """Prints and writes the sweep's table and draws its reward comparison when a multirun ends."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        table = _attempt("table", lambda: write_sweep_table(sweep_dir, maximize=_maximizes(config)))
        if table is not None:
            print(f"{table}\n(also in {sweep_dir / SUMMARY_FILE})", flush=True)
        plot = _attempt("plot", lambda: write_sweep_plot(sweep_dir))
        if plot is not None:
            print(f"Sweep comparison plot: {plot}", flush=True)
