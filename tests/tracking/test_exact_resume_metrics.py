"""metrics.jsonl across a crash and resume (slime.tracking.continuity): every step once, none missing,
wherever the kill landed relative to the checkpoint's commit and the step's logging; samples.jsonl keeps
each rollout's previews at most once."""

from __future__ import annotations

import json
from pathlib import Path

from slime.tracking.continuity import reconcile, stage, staged_path
from slime.tracking.jsonl import JsonlWriter, read_jsonl
from slime.tracking.naming import RunIdentity
from slime.tracking.tracker import Tracker
from tests.helpers.compose import typed_config

K = 2


def _records(rollout_id: int) -> list[dict]:
    """Rollout `rollout_id`'s records as the driver logs them: K train steps, then the rollout's own."""
    steps = [{"rollout/step": rollout_id, "train/step": rollout_id * K + i, "train/loss": float(i)} for i in range(K)]
    return [*steps, {"rollout/step": rollout_id, "rollout/raw_reward": 0.5 + rollout_id}]


def _log(run_dir: Path, records: list[dict], *, partial: str = "") -> Path:
    writer = JsonlWriter(run_dir / "metrics.jsonl")
    for record in records:
        writer.write(record)
    writer.close()
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(partial)  # a write the kill cut short
    return run_dir / "metrics.jsonl"


def _steps(records: list[dict]) -> list[tuple]:
    return [(r.get("rollout/step"), r.get("train/step"), r.get("eval/step")) for r in records]


def test_killed_after_the_commit_before_logging_recovers_the_staged_records(tmp_path):
    root, run_dir = tmp_path / "ckpt", tmp_path
    stage(root, 0, _records(0), run_dir=run_dir)
    (root / "latest_checkpointed_iteration.txt").write_text("0")
    stage(root, 1, _records(1), run_dir=run_dir)
    (root / "latest_checkpointed_iteration.txt").write_text("1")  # checkpoint 1 committed, then the kill
    assert staged_path(root, 1).exists()
    # the kill came after one train record of rollout 1 was written, mid-way through the second
    path = _log(run_dir, [*_records(0), _records(1)[0]], partial='{"rollout/step": 1, "train/st')
    missing = reconcile(path, root, start=2, steps_per_rollout=K)
    assert read_jsonl(path) == _records(0)  # the partial step of rollout 1 dropped, the torn line too
    assert missing == _records(1)
    stage(root, 2, _records(2), run_dir=run_dir)  # the next save: staged files older than the tracker's go
    assert sorted(p.name for p in (root / "tracking").iterdir()) == ["records_1.json", "records_2.json"]


def test_records_past_the_checkpoint_are_rolled_back(tmp_path):
    """checkpoint.save_interval=2: rollout 2 was logged, then the run died before its next checkpoint."""
    root = tmp_path / "ckpt"
    stage(root, 1, _records(1), run_dir=tmp_path)
    eval_after_1 = {"eval/step": 2, "eval/digits": 0.5}
    path = _log(tmp_path, [*_records(0), *_records(1), eval_after_1, *_records(2)])
    assert reconcile(path, root, start=2, steps_per_rollout=K) == []
    assert read_jsonl(path) == [*_records(0), *_records(1), eval_after_1]


def test_another_runs_checkpoint_adds_nothing(tmp_path):
    root = tmp_path / "ckpt"
    stage(root, 1, _records(1), run_dir=tmp_path / "elsewhere")
    path = _log(tmp_path, [])
    assert reconcile(path, root, start=2, steps_per_rollout=K) == [] and read_jsonl(path) == []


def _tracker(run_dir: Path) -> Tracker:
    cfg = typed_config(["logger.wandb.mode=disabled", "logger.plot=false"])
    identity = RunIdentity(project="p", entity=None, group="g", name="n", tags=[], notes="", id="r")
    return Tracker(cfg.logger, run_dir=run_dir, config={}, identity=identity, steps_per_rollout=K)


def test_tracker_resume_logs_the_recovered_records_once(tmp_path):
    root, run_dir = tmp_path / "ckpt", tmp_path / "run"
    tracker = _tracker(run_dir)
    steps = [{"train/loss": 0.0}, {"train/loss": 1.0}]
    tracker.log_step(0, steps, {"rollout/raw_reward": 0.5})
    tracker.stage_step(str(root), 1, steps, {"rollout/raw_reward": 1.5})
    tracker.finish(0)  # the run died here, checkpoint 1 written, rollout 1 not logged

    resumed = _tracker(run_dir)
    resumed.resume(str(root), 2)
    resumed.log_step(2, steps, {"rollout/raw_reward": 2.5})
    resumed.finish(0)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/step"] for r in records if "train/step" in r] == list(range(3 * K))
    assert [r["rollout/raw_reward"] for r in records if "train/step" not in r] == [0.5, 1.5, 2.5]


def test_tracker_resume_drops_the_sample_previews_of_rollouts_that_run_again(tmp_path):
    """Killed in rollout 2 (a line half written) with checkpoint 0: rollouts 1 and 2 run again on resume."""
    run_dir = tmp_path / "run"
    tracker = _tracker(run_dir)
    for rollout_id in range(3):
        tracker.log_samples(rollout_id, [{"rollout_step": rollout_id, "response": f"first {rollout_id}"}])
    tracker.finish(0)
    with (run_dir / "samples.jsonl").open("a") as f:
        f.write('{"rollout_step": 2, "resp')

    resumed = _tracker(run_dir)
    resumed.resume(str(tmp_path / "ckpt"), 1)
    resumed.log_samples(1, [{"rollout_step": 1, "response": "again 1"}])
    resumed.finish(0)
    rows = read_jsonl(run_dir / "samples.jsonl")
    assert [(r["rollout_step"], r["response"]) for r in rows] == [(0, "first 0"), (1, "again 1")]
