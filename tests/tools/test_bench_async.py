"""tools/bench_async.py without main.py: each mode's overrides, a run's columns from its metrics.jsonl, and the rows
of a mode the config refuses (not available) and of a run that failed (exit status 1)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tools import bench_async


def step(i: int, **extra) -> dict:
    """A rollout step's record as the loop logs it (s since the loop began, rewards, staleness)."""
    return {
        "rollout/step": i,
        "perf/step_time": 0.5,
        "perf/rollout_time": 0.25,
        "perf/train_ended_at": 0.5 * (i + 1) - 0.01,
        "rollout/raw_reward": i / 10,
        "rollout/staleness_mean": 1.0,
        "rollout/staleness_max": 1.0 + i % 2,
        **extra,
    }


def write_run(run_dir, records) -> None:
    run_dir.mkdir(parents=True)
    lines = [json.dumps(r) for r in records] + [json.dumps({"rollout/step": 0, "train/loss": 0.1})]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_each_mode_gets_its_keys_and_the_interval_goes_to_one_step_only():
    extra = ["rollout.weight_sync.interval=2", "seed=3"]
    off = bench_async.run_overrides("off", extra, 20)
    assert off[: len(bench_async.BASE)] == bench_async.BASE
    assert off[len(bench_async.BASE) :] == ["train.num_rollout=20", "train.async=off", "seed=3"]
    assert bench_async.run_overrides("one_step", extra, None)[-4:] == [
        "train.async=one_step", "cluster.colocate=false", "rollout.weight_sync.interval=2", "seed=3",
    ]  # fmt: skip
    assert "train.max_staleness=1" in bench_async.run_overrides("full", [], None)


def test_a_runs_columns_come_from_its_step_records(tmp_path):
    write_run(tmp_path / "run", [step(i, **{"perf/trainer_idle_time": 0.1}) for i in range(4)])
    cols = bench_async.summarise(bench_async.step_records(tmp_path / "run"))
    assert cols["steps"] == 4 and cols["s_per_step"] == pytest.approx(1.99 / 4)
    assert (cols["step_time"], cols["rollout_time"], cols["trainer_idle"]) == (0.5, 0.25, 0.1)
    assert cols["last3_reward"] == pytest.approx(0.2)
    assert (cols["staleness_mean"], cols["staleness_max"], cols["engine_idle"]) == (1.0, 2.0, None)


def fake_main(outcomes: dict[str, tuple[int, str]]):
    """run_main for the bench: per mode (read from the overrides) an exit status and stderr; a 0 writes 4 steps."""

    def run_main(run_dir, overrides, timeout_s):
        mode = next(o.split("=")[1] for o in overrides if o.startswith("train.async="))
        code, stderr = outcomes.get(mode, (0, ""))
        if code == 0:
            write_run(run_dir, [step(i) for i in range(4)])
        return subprocess.CompletedProcess(["main.py"], code, "", stderr), 1.0

    return run_main


def test_a_refused_full_is_not_available_and_a_failed_run_fails_the_bench(tmp_path, monkeypatch, capsys):
    refused = "Configuration error: invalid configuration (1 problem):\n  - train.async='full': not yet"
    monkeypatch.setattr(bench_async, "run_main", fake_main({"full": (2, refused)}))
    assert bench_async.main(["--out", str(tmp_path / "a"), "--num-rollout", "4"]) == 0
    table = capsys.readouterr().out
    assert "full      not available: - train.async='full': not yet" in table
    rows = json.loads((tmp_path / "a" / "bench_async.json").read_text())["rows"]
    assert [(r["mode"], r["status"], r.get("columns", {}).get("ratio")) for r in rows] == [
        ("off", "ok", 1.0), ("one_step", "ok", 1.0), ("full", "not available", None),
    ]  # fmt: skip
    monkeypatch.setattr(bench_async, "run_main", fake_main({"one_step": (1, "Traceback ...\nRuntimeError: boom")}))
    assert bench_async.main(["--out", str(tmp_path / "b"), "--modes", "off,one_step"]) == 1
    assert "one_step  failed: RuntimeError: boom" in capsys.readouterr().out


def test_a_full_run_without_its_buffer_metric_is_flagged(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_async, "run_main", fake_main({}))
    assert bench_async.main(["--out", str(tmp_path), "--modes", "full"]) == 0
    assert "no rollout/buffer_depth: not the fully async loop?" in capsys.readouterr().out
