"""The sweep's end table (slime/tracking/sweep_table.py) through the Hydra callback: the overrides that tell runs
apart, the objective, the last reward, wall time and run dir, the best run marked, and sweep_summary.md."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from slime.tracking.sweep import SweepSummary, sweep_runs


def _job(sweep, name, overrides, *, objective=None, reward=None, elapsed=10.0, status="completed"):
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if status is None:  # the job never got past validation: no result.json, no metrics
        return job
    (job / "metrics.jsonl").write_text(json.dumps({"rollout/step": 0, "rollout/raw_reward": reward or 0.0}) + "\n")
    result = {
        "status": status,
        "objective": {"name": "rollout/raw_reward", "value": objective},
        "final_metrics": {"rollout/raw_reward": reward},
        "elapsed_s": elapsed,
        "run_dir": str(job),
    }
    (job / "result.json").write_text(json.dumps(result))
    return job


def _sweep(tmp_path):
    sweep = tmp_path / "sweep"
    shared = ["train.num_rollout=5", f"hydra.sweep.dir={sweep}", "paths.root_dir=/x"]
    _job(sweep, "0", ["algo.eps_clip=0.1", "train.lr=1e-3", *shared], objective=0.5, reward=0.5, elapsed=61.25)
    _job(sweep, "1", ["algo.eps_clip=0.2", "train.lr=1e-3", *shared], objective=0.75, reward=0.75, elapsed=58.0)
    _job(sweep, "2", ["algo.eps_clip=0.3", "train.lr=1e-3", *shared], status="failed", elapsed=3.5)
    _job(sweep, "10", ["algo.eps_clip=0.4", "train.lr=1e-3", *shared], status=None)
    return sweep


def _rows(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_the_table_names_what_differs_and_marks_the_best(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    header, rule, *rows = _rows((sweep / "sweep_summary.md").read_text())
    assert header == ["", "job", "algo.eps_clip", "objective (rollout/raw_reward)", "last reward", "status",
                      "wall s", "run dir"]  # fmt: skip
    assert set(rule) == {"---"}
    assert rows == [
        ["", "0", "0.1", "0.5000", "0.5000", "completed", "61.2", str(sweep / "0")],
        ["best", "1", "0.2", "0.7500", "0.7500", "completed", "58.0", str(sweep / "1")],
        ["", "2", "0.3", "-", "-", "failed", "3.5", str(sweep / "2")],
        ["", "10", "0.4", "-", "-", "no result", "-", str(sweep / "10")],
    ]
    printed = capsys.readouterr().out
    assert "sweep_summary.md" in printed and "train.lr" not in printed and "num_rollout" not in printed
    best_line = next(line for line in printed.splitlines() if line.startswith("best"))
    assert best_line.split()[:3] == ["best", "1", "0.2"]
    assert (sweep / "sweep_rewards.png").stat().st_size > 10_000


def test_a_minimizing_sweeper_marks_the_lowest_objective(tmp_path):
    sweep = _sweep(tmp_path)
    config = {"hydra": {"sweep": {"dir": str(sweep)}, "sweeper": {"direction": "minimize"}}}
    SweepSummary().on_multirun_end(OmegaConf.create(config))
    best = [row for row in _rows((sweep / "sweep_summary.md").read_text()) if row[0] == "best"]
    assert [row[1] for row in best] == ["0"]


def test_the_plot_legend_names_only_the_overrides_that_differ(tmp_path):
    assert list(sweep_runs(_sweep(tmp_path))) == [
        "0: algo.eps_clip=0.1",
        "1: algo.eps_clip=0.2",
        "2: algo.eps_clip=0.3",
    ]
