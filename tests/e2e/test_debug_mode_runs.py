"""debug=rollout_only then debug=train_only as main.py runs, the workflow docs/troubleshooting.md#debug-modes gives: a
rollout_only run dumps its samples, a train_only run trains from them (their validation:
tests/driver/test_debug_modes.py)."""

from __future__ import annotations

import pytest

from slime.tracking.jsonl import read_jsonl
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_py


@pytest.mark.slow
def test_rollout_only_dumps_then_train_only_trains_from_them(tmp_path):
    rollout_dir, train_dir = tmp_path / "rollout_only", tmp_path / "train_only"
    proc = main_py(rollout_dir, "debug=rollout_only", "debug.save_rollout_data=true", "train.num_rollout=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_jsonl(rollout_dir / "metrics.jsonl")
    assert [r["rollout/step"] for r in records] == [0, 1]
    assert not any(k.startswith("train/") for r in records for k in r)  # nothing trained
    assert not (rollout_dir / "checkpoints").exists()  # nothing saved
    phases = (rollout_dir / "main.log").read_text()
    assert "phase rollout (rollout 1) started" in phases and "phase train" not in phases
    assert "phase weight_sync" not in phases  # the engines keep model.hf_checkpoint's weights
    dumps = [read_jsonl(rollout_dir / "rollout_data" / f"{i}.jsonl") for i in range(2)]
    assert all(dump and all(s["reward"] is not None for s in dump) for dump in dumps)

    proc = main_py(
        train_dir, "debug=train_only", f"debug.load_rollout_data={rollout_dir / 'rollout_data'}", "train.num_rollout=2"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (train_dir / "logs").exists()  # no router, no engine (their logs live there)
    records = read_jsonl(train_dir / "metrics.jsonl")
    train_steps = [r["train/step"] for r in records if "train/step" in r]
    assert len(train_steps) >= 2 and train_steps == list(range(len(train_steps)))
    assert {r["rollout/step"] for r in records if "train/pg_loss" in r} == {0, 1}
    rewards = [r["rollout/raw_reward"] for r in records if "rollout/raw_reward" in r]
    assert rewards == [r["rollout/raw_reward"] for r in read_jsonl(rollout_dir / "metrics.jsonl")]  # those samples
    assert (train_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert_no_run_processes()
