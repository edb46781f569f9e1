"""A whole run SIGKILLed (every process) in its save phase resumes with checkpoint.resume=auto from the last complete
checkpoint (a save killed at each file, without Ray: tests/train/test_atomic_checkpoint.py)."""

from __future__ import annotations

import json

import pytest

from slime.config.resume import tracked_iteration
from slime.train.fsdp.checkpoint import iter_dir
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_py


@pytest.mark.slow
def test_run_killed_in_its_save_resumes_from_the_last_complete_checkpoint(tmp_path):
    """SIGKILL to every process of the run as it enters the save of rollout 1; resume=auto then finishes it."""
    run_dir = tmp_path / "run"
    common = ["train.num_rollout=3", "checkpoint.save_interval=1"]
    proc = main_py(run_dir, *common, "debug.signal_at=save:1", "debug.signal=SIGKILL", "debug.signal_delay_s=0.05")
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert_no_run_processes(timeout_s=10)
    root = run_dir / "checkpoints"
    last = tracked_iteration(str(root))
    assert last in (0, 1)  # the kill lands during the save: before or after its tracker was replaced
    complete = iter_dir(root, last)
    assert (complete / "model" / "config.json").exists() and (complete / "optimizer.pt").exists()
    assert (root / "rollout" / f"global_dataset_state_dict_{last}.pt").exists()

    proc = main_py(run_dir, *common, "checkpoint.resume=auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["start_rollout"] == last + 1
    assert result["rollouts_completed"] == 3 - (last + 1)
    assert tracked_iteration(str(root)) == 2
    assert not list(root.glob(".iter_*"))
    assert_no_run_processes()
