"""train.async end to end: main.py's one-step-async loop overlaps rollout k+1 with step k's training; the fully
async loop survives a SIGKILL and trains each prompt once per epoch (the loops' unit tests:
tests/driver/test_async_training.py; the stream's: tests/rollout/test_stream.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from slime.assets.digit_task import write_dataset
from slime.config.resume import tracked_iteration
from slime.rollout.dumps import epoch_coverage
from tests.helpers.compose import ROOT
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_argv, main_py, two_epochs


@pytest.mark.slow
def test_async_run_overlaps_generation_with_training(tmp_path):
    """main.py train.async=true on the embedded default, 3 rollout steps: rollout k+1's generation starts
    before step k's training ends (its overlap with training is recorded), staleness is 0 then 1 (per sample too),
    and the run completes."""
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
        # how much of it overlapped training is timing: the step first awaits the last push's check, which runs
        # beside this generation, and a 2-token rollout on a busy machine can end within that wait
        assert after["perf/rollout_overlap_time"] >= 0
    assert [(r["rollout/staleness_mean"], r["rollout/staleness_max"]) for r in steps] == [(0, 0), (1, 1), (1, 1)]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {(s["rollout_step"], s["staleness"]) for s in samples} == {(0, 0), (1, 1), (2, 1)}
    assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_full_async_run_killed_in_a_save_resumes_and_trains_each_prompt_once_per_epoch(tmp_path):
    """train.async=full over 2 epochs of 16 prompts (8 steps of 4 groups), stale groups regenerated: SIGKILLed as it
    enters the save of rollout 3, resumed with checkpoint.resume=auto. The dumps show every prompt trained exactly
    once per epoch (the checkpoint kept the stream's finished and in-flight groups), no trained sample more than
    train.max_staleness versions old; each step logs its staleness histogram, buffer depth and idle times."""
    data = write_dataset(tmp_path / "digits.jsonl", num_prompts=20, seed=0)
    run_dir = tmp_path / "run"
    common = [
        "train.async=full",
        "train.max_staleness=1",
        "rollout.stale_policy=regenerate",
        "rollout.deterministic=false",
        *two_epochs(data),
        "checkpoint.save_interval=1",
        "debug.save_rollout_data=true",
    ]
    proc = main_py(run_dir, *common, "debug.signal_at=save:3", "debug.signal=SIGKILL", "debug.signal_delay_s=0.05")
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert_no_run_processes(timeout_s=10)
    last = tracked_iteration(str(run_dir / "checkpoints"))
    assert last in (2, 3)
    assert (run_dir / "checkpoints" / "rollout" / f"stream_{last}.pt").exists()

    proc = main_py(run_dir, *common, "checkpoint.resume=auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["start_rollout"] == last + 1
    assert epoch_coverage(run_dir / "rollout_data") == {0: dict.fromkeys(range(16), 1), 1: dict.fromkeys(range(16), 1)}
    dumped = [json.loads(line) for path in (run_dir / "rollout_data").iterdir() for line in path.open()]
    assert len(dumped) == 2 * 16 * 8 and all(0 <= s["staleness"] <= 1 for s in dumped)
    assert all(len(s["token_versions"]) == s["response_length"] for s in dumped)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(0 <= s["staleness"] <= 1 for s in samples)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "rollout/step" in r and "train/step" not in r]  # a step's record, maybe staged
    assert [r["rollout/step"] for r in steps] == list(range(8))
    for r in steps:
        assert sum(v for k, v in r.items() if k.startswith("rollout/staleness_hist/")) == 4 * 8
        assert r["rollout/staleness_max"] <= 1 and r["rollout/buffer_depth"] >= 0
        assert r["perf/trainer_idle_time"] >= 0 and r["perf/engine_idle_time"] >= 0
