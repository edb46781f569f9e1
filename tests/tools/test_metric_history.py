"""The metric-history gate (tests/helpers/metric_history.py): a planted regression fails naming the run and the
figure; a refresh takes the report in and records its reason."""

from __future__ import annotations

import json

import pytest

from tests.helpers import metric_history
from tests.helpers.metric_history import DEFAULT_TOLERANCES, check, figures_of, read_report, refresh

GOOD = {"last3_reward": 0.95, "first_step_0_8": 30, "max_logprob_diff": 3e-7, "wall_s": 80.0, "cpu_s": 120.0}


def _baseline(path, **runs):
    path.write_text(json.dumps({"tolerances": DEFAULT_TOLERANCES, "runs": runs, "history": []}))
    return path


def _report(path, **runs):
    path.write_text("".join(json.dumps({"run": name, **figures}) + "\n" for name, figures in runs.items()))
    return path


def test_a_run_whose_last3_reward_is_0_2_lower_fails_the_gate_naming_it(tmp_path, capsys):
    baseline = _baseline(tmp_path / "baseline.json", embedded=GOOD, moe=GOOD)
    worse = {**GOOD, "last3_reward": GOOD["last3_reward"] - 0.2}
    assert check(_report(tmp_path / "r.jsonl", embedded=worse, moe=GOOD), baseline) == 1
    out = capsys.readouterr().out
    assert "FAILED (embedded: last3_reward)" in out
    row = next(line for line in out.splitlines() if line.startswith("embedded") and "last3_reward" in line)
    assert row.split() == ["embedded", "last3_reward", "0.95", "0.75", "-0.2", "REGRESSION"]


def test_figures_within_tolerance_pass_and_each_tolerance_bites(tmp_path, capsys):
    baseline = _baseline(tmp_path / "baseline.json", run=GOOD)
    within = {"last3_reward": 0.86, "first_step_0_8": 38, "max_logprob_diff": 2e-6, "wall_s": 230.0, "cpu_s": 230.0}
    assert check(_report(tmp_path / "ok.jsonl", run=within), baseline) == 0
    for figure, bad in [("first_step_0_8", 39), ("first_step_0_8", None), ("max_logprob_diff", 4e-6),
                        ("wall_s", 241.0), ("cpu_s", 241.0), ("last3_reward", None)]:  # fmt: skip
        assert check(_report(tmp_path / "bad.jsonl", run={**GOOD, figure: bad}), baseline) == 1, (figure, bad)
        assert f"FAILED (run: {figure})" in capsys.readouterr().out


def test_a_baseline_run_the_report_lacks_fails_and_a_new_run_passes(tmp_path, capsys):
    baseline = _baseline(tmp_path / "baseline.json", embedded=GOOD, vllm=GOOD)
    assert check(_report(tmp_path / "r.jsonl", embedded=GOOD), baseline) == 1
    assert "vllm: last3_reward" in capsys.readouterr().out
    assert check(_report(tmp_path / "r.jsonl", embedded=GOOD, vllm=GOOD, lora=GOOD), baseline) == 0
    assert "not in the baseline yet" in capsys.readouterr().out


def test_refresh_takes_the_report_and_records_the_reason(tmp_path, monkeypatch):
    baseline = _baseline(tmp_path / "baseline.json", embedded=GOOD, vllm=GOOD)
    faster = {**GOOD, "wall_s": 40.0}
    report = _report(tmp_path / "r.jsonl", embedded=faster)
    with pytest.raises(SystemExit, match="a reason is required"):
        refresh(report, "  ", baseline)
    monkeypatch.setattr("builtins.input", lambda prompt: "batched deterministic decoding")
    assert metric_history.main(["refresh", str(report), "--baseline", str(baseline)]) == 0
    written = json.loads(baseline.read_text())
    assert written["runs"] == {"embedded": faster, "vllm": GOOD}
    (entry,) = written["history"]
    assert entry["reason"] == "batched deterministic decoding" and entry["runs"] == ["embedded"]


def test_the_figures_of_a_run_directory(tmp_path, monkeypatch):
    lines = [{"rollout/step": s, "rollout/raw_reward": r} for s, r in enumerate([0.1, 0.5, 0.8, 0.7, 0.9])]
    lines += [{"train/step": s, "train/train_rollout_logprob_abs_diff": d} for s, d in enumerate([1e-7, 4e-7])]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "result.json").write_text(json.dumps({"elapsed_s": 61.5}))
    figures = figures_of(tmp_path, cpu_s=90.04)
    assert figures == {"last3_reward": 0.8, "first_step_0_8": 2, "max_logprob_diff": 4e-7, "wall_s": 61.5,
                       "cpu_s": 90.0}  # fmt: skip
    report = tmp_path / "report.jsonl"
    monkeypatch.setenv(metric_history.REPORT_VAR, str(report))
    metric_history.record("a", tmp_path)
    metric_history.record("a", tmp_path)  # recorded twice: the last counts
    assert read_report(report) == {"a": {**figures, "cpu_s": None}}


def test_timings_are_judged_scaled_to_the_baselines_machine(tmp_path, capsys):
    """A run 3.75x slower on a machine that took twice the baseline machine's calibration is 1.9x slower there
    (within the 3x of wall_s); a faster machine does not hide a regression; without calibrations, as measured."""
    baseline = _baseline(tmp_path / "baseline.json", run={**GOOD, "machine_s": 1.0})
    slow_machine = {**GOOD, "wall_s": 300.0, "cpu_s": 200.0}
    report = _report(tmp_path / "slow.jsonl", run=slow_machine)
    assert check(report, baseline) == 1  # not calibrated: 3.75x
    assert "FAILED (run: wall_s)" in capsys.readouterr().out
    with report.open("a") as out:
        out.write(json.dumps({"machine_s": 2.0}) + "\n")
    assert read_report(report)["run"]["machine_s"] == 2.0
    assert check(report, baseline) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "wall_s" in line)
    assert "x3.75, x1.88 on the baseline's machine" in row
    fast = _report(tmp_path / "fast.jsonl", run={**GOOD, "wall_s": 130.0})
    with fast.open("a") as out:
        out.write(json.dumps({"machine_s": 0.5}) + "\n")
    assert check(fast, baseline) == 1  # 1.6x here is 3.25x on the baseline's machine
    assert "FAILED (run: wall_s)" in capsys.readouterr().out


def test_calibrating_appends_this_machines_seconds_and_a_refresh_keeps_them_beside_the_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(metric_history, "machine_seconds", lambda: 1.25)
    report = _report(tmp_path / "r.jsonl", embedded=GOOD)
    assert metric_history.main(["calibrate", str(report)]) == 0
    baseline = _baseline(tmp_path / "baseline.json", embedded=GOOD)
    refresh(report, "calibrated", baseline)
    assert json.loads(baseline.read_text())["runs"]["embedded"] == {**GOOD, "machine_s": 1.25}


def test_this_machines_calibration_is_a_positive_time_that_repeats():
    first, second = metric_history.machine_seconds(repeats=2), metric_history.machine_seconds(repeats=2)
    assert 0 < first < 30 and 0 < second < 30
    assert 0.25 < first / second < 4  # the fastest of its repeats: a busy moment does not count


def test_without_a_baseline_the_gate_fails_saying_how_to_make_one(tmp_path, capsys):
    assert check(_report(tmp_path / "r.jsonl", embedded=GOOD), tmp_path / "none.json") == 1
    assert "no baseline at" in capsys.readouterr().out
