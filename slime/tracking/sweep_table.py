"""The sweep's end table: one row per run, the overrides that differ between runs, the objective, the last reward,
the wall time and the run directory, the best run marked. Printed when a multirun ends and written to
`<sweep dir>/sweep_summary.md` (slime/tracking/sweep.py).

A run is a job directory under the sweep directory: its `.hydra/overrides.yaml` (the job's command-line overrides)
and its `result.json` (written at the end of every run that got past validation; a job without one is shown as
"no result"). Overrides every run shares, and Hydra's and path keys, are left out: they do not tell runs apart.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Optional

import yaml

HIDDEN_PREFIXES = ("hydra.", "hydra/", "paths.")
REWARD_KEY = "rollout/raw_reward"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepRun:
    """One job of the sweep as its directory left it."""

    job_dir: Path
    overrides: dict[str, str]  # key -> value as written on the command line (hidden keys left out)
    result: Optional[dict[str, Any]]  # result.json, None when the job left none

    @property
    def objective(self) -> Optional[float]:
        value = ((self.result or {}).get("objective") or {}).get("value")
        return None if value is None or not math.isfinite(float(value)) else float(value)

    @property
    def objective_name(self) -> Optional[str]:
        return ((self.result or {}).get("objective") or {}).get("name")


def _job_order(path: Path) -> list:
    return [(0, int(s)) if s.isdigit() else (1, s) for s in path.parts]


def read_overrides(job_dir: Path) -> dict[str, str]:
    """The job's command-line overrides (`.hydra/overrides.yaml`) as key -> value, hidden keys left out."""
    path = job_dir / ".hydra" / "overrides.yaml"
    entries = (yaml.safe_load(path.read_text()) or []) if path.exists() else []
    pairs = (str(entry).partition("=") for entry in entries)
    return {key: value for key, _, value in pairs if not key.lstrip("+~").startswith(HIDDEN_PREFIXES)}


def find_runs(sweep_dir: Path) -> list[SweepRun]:
    """Every job directory under `sweep_dir` (one holding `.hydra/overrides.yaml`, `result.json` or
    `metrics.jsonl`), in job order."""
    markers = ("result.json", "metrics.jsonl", ".hydra/overrides.yaml")
    dirs = {p.parent.parent if p.parent.name == ".hydra" else p.parent for m in markers for p in sweep_dir.rglob(m)}
    dirs.discard(sweep_dir)  # the sweep's own multirun.yaml/.hydra is not a job
    runs = []
    for job_dir in sorted(dirs, key=_job_order):
        result_path = job_dir / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else None
        runs.append(SweepRun(job_dir=job_dir, overrides=read_overrides(job_dir), result=result))
    return runs


def differing_keys(runs: list[SweepRun]) -> list[str]:
    """The override keys whose value is not the same in every run (in first-seen order)."""
    keys: dict[str, None] = {}
    for run in runs:
        keys.update(dict.fromkeys(run.overrides))
    return [k for k in keys if len({run.overrides.get(k) for run in runs}) > 1]


def run_label(run: SweepRun, keys: list[str]) -> str:
    """`<job>: key=value ...` with only the keys that tell runs apart."""
    shown = " ".join(f"{k}={run.overrides[k]}" for k in keys if k in run.overrides)
    return f"{run.job_dir.name}: {shown}" if shown else run.job_dir.name


def best_run(runs: list[SweepRun], *, maximize: bool = True) -> Optional[SweepRun]:
    scored = [run for run in runs if run.objective is not None]
    if not scored:
        return None
    pick = max if maximize else min
    return pick(scored, key=lambda run: run.objective)


def _number(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{float(value):.{digits}f}"


def table_rows(runs: list[SweepRun], *, maximize: bool = True) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the sweep table, as text cells."""
    keys = differing_keys(runs)
    best = best_run(runs, maximize=maximize)
    names = {run.objective_name for run in runs if run.objective_name}
    objective = f"objective ({names.pop()})" if len(names) == 1 else "objective"
    header = ["", "job", *keys, objective, "last reward", "status", "wall s", "run dir"]
    rows = []
    for run in runs:
        result = run.result or {}
        rows.append(
            [
                "best" if run is best else "",
                run.job_dir.name,
                *(run.overrides.get(k, "") for k in keys),
                _number(run.objective),
                _number((result.get("final_metrics") or {}).get(REWARD_KEY)),
                result.get("status", "no result"),
                _number(result.get("elapsed_s"), 1),
                str(run.job_dir),
            ]
        )
    return header, rows


def render_text(header: list[str], rows: list[list[str]]) -> str:
    """A plain aligned table for the terminal."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in (header, *rows)]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def render_markdown(header: list[str], rows: list[list[str]], *, title: str) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([f"# {title}", "", line(header), line(["---"] * len(header)), *map(line, rows), ""])
