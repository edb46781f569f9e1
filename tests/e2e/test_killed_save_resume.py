"""A whole run SIGKILLed (every process) in its save phase resumes with checkpoint.resume=auto from the last complete
checkpoint (a save killed at each file, without Ray: tests/train/test_atomic_checkpoint.py); a run whose router or
only engine is killed between steps stops naming it, and resumes the same way; a NaN step stops or is skipped; a save
that fills the disk stops naming it. Engines killed in a rollout or a push with fault tolerance:
tests/e2e/test_engine_faults.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from slime.config.manifest import MANIFEST, sha256_of, torn_file
from slime.config.resume import tracked_iteration
from slime.tracking.jsonl import read_jsonl
from slime.train.fsdp.checkpoint import iter_dir
from tests.helpers.compose import ROOT
from tests.helpers.processes import TEST_RUN_VAR, assert_no_run_processes
from tests.helpers.runs import main_argv, main_py, rewards, run_argv
from tests.helpers.small_disk import on_small_disk


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [("SIGKILL", -9), ("SIGTERM", 143)])
def test_run_killed_in_its_save_resumes_from_the_last_complete_checkpoint(sig, code, tmp_path):
    """SIGKILL to every process of the run as it enters the save of rollout 1 (a crash), or SIGTERM to the driver (a
    scheduler's stop: a graceful teardown); resume=auto then finishes it. A longer run resumed over the SIGTERM run's
    checkpoints after a file of the newest was truncated starts from the one before it."""
    run_dir = tmp_path / "run"
    common = ["train.num_rollout=3", "checkpoint.save_interval=1"]
    proc = main_py(run_dir, *common, "debug.signal_at=save:1", f"debug.signal={sig}", "debug.signal_delay_s=0.05")
    assert proc.returncode == code, proc.stderr[-3000:]
    assert_no_run_processes(timeout_s=10)
    root = run_dir / "checkpoints"
    last = tracked_iteration(str(root))
    assert last in (0, 1)  # the kill lands during the save: before or after its tracker was replaced
    complete = iter_dir(root, last)
    assert (complete / "model" / "config.json").exists() and (complete / "optimizer.pt").exists()
    assert (root / "rollout" / f"global_dataset_state_dict_{last}.pt").exists()
    assert torn_file(complete) is None and (complete / MANIFEST).exists()
    prompt_data = yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["prompt_data"]
    saved_with = json.loads((root / "rollout" / "prompt_data.json").read_text())
    assert saved_with == {"prompt_data": prompt_data, "sha256": sha256_of(Path(prompt_data))}

    proc = main_py(run_dir, *common, "checkpoint.resume=auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["start_rollout"] == last + 1
    assert result["rollouts_completed"] == 3 - (last + 1)
    assert tracked_iteration(str(root)) == 2
    assert not list(root.glob(".iter_*"))
    assert_no_run_processes()

    if sig == "SIGTERM":  # then the newest checkpoint torn: resume=auto falls back to the one before and says so
        torn = iter_dir(root, 2) / "optimizer.pt"
        torn.write_bytes(torn.read_bytes()[:100])
        proc = main_py(run_dir, *common, "train.num_rollout=4", "checkpoint.resume=auto")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"checkpoint under {root}: iteration 2 is torn: " in proc.stderr
        assert "resuming from iteration 1, the newest whole one" in proc.stderr
        result = json.loads((run_dir / "result.json").read_text())
        assert result["start_rollout"] == 2 and result["rollouts_completed"] == 2
        assert len(rewards(run_dir)) == 4  # each rollout step logged once: the records after 1 were cut back
        assert_no_run_processes()
        return
    # the cursor was saved over that file: resuming over another one stops before anything starts
    other = tmp_path / "other_prompts.jsonl"
    other.write_text("".join(Path(prompt_data).read_text().splitlines(keepends=True)[:16]))
    proc = main_py(run_dir, *common, "train.num_rollout=4", "checkpoint.resume=auto", f"data.prompt_data={other}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"resuming from {root}: the checkpoint's data source read {prompt_data!r}" in proc.stderr


KILLED = {  # what the test kills: how its process shows, and what the failed run's error must say of it
    "router": (("launch_router", "sglang::router"), "the router at http://"),
    "engine": (("slime.engine.hf.server",), "engine 0 at http://"),
}


def is_(target: str, process: psutil.Process) -> bool:
    """`process` is the run's router (its title is `sglang::router` once it runs) or its engine's server."""
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return False
    return any(mark in command for mark in KILLED[target][0])


@pytest.mark.slow
@pytest.mark.parametrize("target", list(KILLED))
def test_a_router_or_engine_killed_mid_run_stops_it_naming_what_died_and_resume_continues(target, tmp_path):
    """SIGKILL to the router process, or to the only engine's server (no fault tolerance), once rollout 0 is
    logged: the run stops (exit 3) naming what died, not only that requests failed (a router's 503); nothing is
    left running; resume=auto continues after the last checkpoint."""
    run_dir = tmp_path / "run"
    common = ["train.num_rollout=4", "checkpoint.save_interval=1"]
    env = {**os.environ, TEST_RUN_VAR: str(run_dir)}
    proc = subprocess.Popen(
        main_argv(run_dir, *common), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.monotonic() + 300
    while not ((run_dir / "metrics.jsonl").exists() and rewards(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    victims = [p for p in psutil.Process(proc.pid).children(recursive=True) if is_(target, p)]
    assert len(victims) == 1, f"the run's {target} process was not found"
    victims[0].send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 3, stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "failed" and KILLED[target][1] in result["error"]
    if target == "router":
        assert f"(pid {victims[0].pid}) died with exit status -9" in result["error"]
    else:
        assert f"(pid {victims[0].pid}) has no server process" in result["error"]
    assert_no_run_processes()

    root = run_dir / "checkpoints"
    last = tracked_iteration(str(root))
    resumed = main_py(run_dir, *common, "checkpoint.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["start_rollout"] == last + 1
    assert len(rewards(run_dir)) == 4  # each rollout step logged once across the two runs
    assert_no_run_processes()


@pytest.mark.slow
def test_a_nonfinite_gradient_stops_the_run_naming_it_or_is_skipped(tmp_path):
    """debug.nonfinite_at gives rollout 1's step a NaN gradient on the real trainer: by default the run stops (exit 3)
    naming the step and the tensor with checkpoint 0 the newest, and resume=auto finishes it; with
    train.on_nonfinite=skip the run completes with that one step dropped and counted."""
    common = ["train.num_rollout=3", "checkpoint.save_interval=1"]
    stop_dir, skip_dir = tmp_path / "stop", tmp_path / "skip"
    stopped = main_py(stop_dir, *common, "debug.nonfinite_at=train:1")
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    result = json.loads((stop_dir / "result.json").read_text())
    assert result["status"] == "failed" and result["phase"] == "train"
    k = yaml.safe_load((stop_dir / "config.yaml").read_text())["train"]["num_steps_per_rollout"]
    assert result["error"].startswith(  # rollout 1's first optimizer step
        f"NonFiniteError: train step {k}: the gradient norm is nan; the first non-finite tensor on rank 0 is the "
        "gradient of model."
    ), result["error"]
    assert tracked_iteration(str(stop_dir / "checkpoints")) == 0
    assert_no_run_processes()
    resumed = main_py(stop_dir, *common, "checkpoint.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((stop_dir / "result.json").read_text())["start_rollout"] == 1

    skipped = main_py(skip_dir, *common, "debug.nonfinite_at=train:1", "train.on_nonfinite=skip")
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    steps = [r for r in read_jsonl(skip_dir / "metrics.jsonl") if "train/step" in r]
    assert [r["train/nonfinite_skipped"] for r in steps] == [float(step == k) for step in range(3 * k)]
    assert_no_run_processes()


@pytest.mark.slow
def test_a_save_that_fills_the_disk_stops_the_run_naming_the_path_and_resume_continues(tmp_path):
    """checkpoint.save on a 2 MiB disk of its own (a tmpfs: tests/helpers/small_disk.py) that holds one checkpoint of
    the embedded model (~1.3 MB) and not two: the save of rollout 1 runs out of space, removes its staged files and
    stops the run (exit 3) naming the path, the free space and what a checkpoint needs; iteration 0 stays the newest
    and whole. Resumed from a copy of that disk on a larger one, resume=auto finishes the run, each rollout logged
    once."""
    run_dir, disk, kept = tmp_path / "run", tmp_path / "small_disk", tmp_path / "checkpoints"
    common = ["train.num_rollout=3", "checkpoint.save_interval=1"]
    argv = main_argv(run_dir, *common, f"checkpoint.save={disk}")
    full = run_argv(on_small_disk(argv, disk, 2 * 1024 * 1024, kept), str(run_dir))
    assert full.returncode == 3, full.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "failed" and result["phase"] == "save"
    assert f"checkpoint save to {iter_dir(disk, 1)}: the disk is full (" in result["error"], result["error"]
    assert f"MiB free at {disk}); a checkpoint needs about 1 MiB there" in result["error"]
    assert "iteration 0 stays the newest checkpoint" in result["error"]
    assert tracked_iteration(str(kept)) == 0 and torn_file(iter_dir(kept, 0)) is None
    assert not list(kept.glob(".iter_*")) and not iter_dir(kept, 1).exists()  # the staged files were removed
    assert_no_run_processes()

    resumed = main_py(run_dir, *common, f"checkpoint.save={kept}", "checkpoint.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["start_rollout"] == 1
    assert len(rewards(run_dir)) == 3 and tracked_iteration(str(kept)) == 2
    assert_no_run_processes()
