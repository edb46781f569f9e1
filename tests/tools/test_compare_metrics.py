"""tools/compare_metrics.py: runs that differ only in timings are identical; a changed, missing or extra value
is reported with its record and key, and the exit status says which."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.compose import ROOT

TOOL = ROOT / "tools" / "compare_metrics.py"


def write_run(directory, records):
    directory.mkdir()
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


def compare(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=60)


STEP = {"rollout/step": 0, "train/loss": 0.25, "perf/rollout_time": 1.5, "perf/train_ended_at": 3.0}


def test_timings_aside_two_runs_are_identical(tmp_path):
    a = write_run(tmp_path / "a", [STEP, {**STEP, "rollout/step": 1}])
    rates = {"perf/train_tflops": 0.02, "perf/mfu": 0.4, "perf/train_tokens_per_s": 99.0}
    rates["rollout/weight_probe_logprob_diff"] = 3e-7
    b = write_run(tmp_path / "b", [{**STEP, "perf/rollout_time": 9.0, **rates}, {**STEP, "rollout/step": 1}])
    proc = compare(a, b / "metrics.jsonl")
    assert proc.returncode == 0 and "2 records: identical (timings aside)" in proc.stdout


def test_a_changed_or_missing_value_is_named(tmp_path):
    a = write_run(tmp_path / "a", [STEP, {**STEP, "rollout/step": 1}])
    b = write_run(tmp_path / "b", [STEP, {"rollout/step": 1, "train/loss": 0.5}])
    proc = compare(a, b)
    assert proc.returncode == 1
    assert "record 1 train/loss: 0.25 vs 0.5" in proc.stdout


def test_first_limits_the_rollouts_compared(tmp_path):
    a = write_run(tmp_path / "a", [STEP, {**STEP, "rollout/step": 1, "train/loss": 1.0}])
    b = write_run(tmp_path / "b", [STEP])
    assert compare(a, b).returncode == 1  # one record more
    assert compare(a, b, "--first", "1").returncode == 0


def test_a_missing_run_exits_2(tmp_path):
    proc = compare(tmp_path / "nowhere", tmp_path)
    assert proc.returncode == 2 and "no metrics.jsonl" in proc.stderr
