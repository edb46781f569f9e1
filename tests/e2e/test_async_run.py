"""train.async=true end to end: main.py's one-step-async loop overlaps rollout k+1 with step k's training (the
loop's unit tests: tests/runtime/test_async_training.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.helpers.compose import ROOT
from tests.helpers.runs import main_argv


@pytest.mark.slow
def test_async_run_overlaps_generation_with_training(tmp_path):
    """main.py train.async=true on the embedded default, 3 rollout steps: rollout k+1's generation starts
    before step k's training ends, staleness is 0 then 1 (per sample too), and the run completes."""
    run_dir = tmp_path / "run"
    cmd = main_argv(run_dir)
    proc = subprocess.run(
        [*cmd, "train.async=true", "train.num_rollout=3"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "perf/step_time" in r]
    assert [r["rollout/step"] for r in steps] == [0, 1, 2]
    for before, after in zip(steps, steps[1:]):
        assert after["perf/rollout_started_at"] < before["perf/train_ended_at"], (before, after)
        assert after["perf/rollout_overlap_time"] > 0
    assert [(r["rollout/staleness_mean"], r["rollout/staleness_max"]) for r in steps] == [(0, 0), (1, 1), (1, 1)]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {(s["rollout_step"], s["staleness"]) for s in samples} == {(0, 0), (1, 1), (2, 1)}
    assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"
