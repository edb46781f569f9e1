"""hydra/launcher=ray_jobs: a real sweep of Ray Jobs on a local cluster the launcher owns, and Ctrl-C during one
(discovery: tests/launcher/test_ray_jobs_discovery.py)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.compose import ROOT
from tests.helpers.processes import session_processes

GOOD, BAD = "tests.helpers.launcher_rewards.digit", "tests.helpers.launcher_rewards.unreachable"


@pytest.mark.slow
def test_optuna_sweep_of_ray_jobs_optimises_the_objective_and_survives_a_failed_job(tmp_path):
    """Hydra's Optuna sweeper (in-memory study) over two Ray Jobs at once on the launcher's local cluster,
    one per reward hook: `digit` completes; `unreachable` raises for every sample, so that run fails in its
    first rollout (exit 3). The failure is reported with the job's log tail, the other job finishes with
    its result.json, Optuna's best value is that job's objective, and no process of the sweep is left.

    Sampler seed 0 draws the two choices once each (TPE's random start-up trials, optuna 2.10)."""
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "main.py",
            "--multirun",
            "hydra/launcher=ray_jobs",
            "hydra.launcher.max_concurrent=2",
            "hydra.launcher.poll_interval_s=0.5",
            "hydra/sweeper=optuna",
            "hydra.sweeper.direction=maximize",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.max_failure_rate=0.5",
            "hydra.sweeper.sampler.seed=0",
            "rollout.rm_type=null",
            f"rollout.custom_rm_path=choice({GOOD},{BAD})",
            "train.num_rollout=1",
            "logger.progress=false",
            "logger.wandb.mode=disabled",  # the jobs' wandb runs and plots: test_end_to_end.py's sweep checks them
            "logger.plot=false",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = {
        next(o for o in r["overrides"] if o.startswith("rollout.custom_rm_path=")): r
        for r in json.loads((sweep_dir / "ray_jobs.json").read_text())
    }
    assert set(records) == {f"rollout.custom_rm_path={GOOD}", f"rollout.custom_rm_path={BAD}"}, records
    good, bad = records[f"rollout.custom_rm_path={GOOD}"], records[f"rollout.custom_rm_path={BAD}"]
    assert (good["status"], good["exit_code"], bad["status"], bad["exit_code"]) == ("SUCCEEDED", 0, "FAILED", 3)
    # The failure names the job and carries the run's own error from its log tail.
    output = proc.stdout + proc.stderr
    reported = [line for line in output.splitlines() if f"job {bad['num']} [" in line and "FAILED (exit code 3" in line]
    assert reported and BAD in reported[0]
    assert "reward service unreachable" in output  # from the failed job's log tail
    assert "RewardFailureError" in bad["error"]
    result = json.loads((Path(good["run_dir"]) / "result.json").read_text())
    assert result["status"] == "completed" and result["rollouts_completed"] == 1
    assert result["objective"] == good["objective"]
    assert result["objective"]["value"] == result["final_metrics"]["rollout/raw_reward"]
    failed = json.loads((Path(bad["run_dir"]) / "result.json").read_text())
    assert (failed["status"], failed["phase"]) == ("failed", "rollout")
    for record in (good, bad):  # each job's own log, kept in its run dir
        assert "Running entrypoint for job" in Path(record["log"]).read_text()
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    # the sweep's table: one row per job, the good one marked best, the failed one said so
    table = [line for line in (sweep_dir / "sweep_summary.md").read_text().splitlines() if line.startswith("| ")]
    rows = {line.split("|")[3].strip(): [c.strip() for c in line.strip("|").split("|")] for line in table[2:]}
    assert set(rows) == {GOOD, BAD}
    assert rows[GOOD][0] == "best" and rows[BAD][0] == "" and rows[BAD][5] == "failed"
    assert best["best_params"] == {"rollout.custom_rm_path": GOOD}
    assert best["best_value"] == pytest.approx(result["objective"]["value"])
    assert session_processes() == []


@pytest.mark.slow
def test_ctrl_c_stops_every_submitted_job_and_the_cluster(tmp_path):
    """SIGINT to the launcher while job 0 runs and Ray holds job 1 (one slot): both are stopped, their
    logs kept, the sweep exits 130 and no process of it is left."""
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.Popen(
        [
            sys.executable,
            "main.py",
            "--multirun",
            "hydra/launcher=ray_jobs",
            "hydra.launcher.max_concurrent=1",
            "hydra.launcher.poll_interval_s=0.5",
            "algo.eps_clip=0.1,0.2",
            "logger.progress=false",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in proc.stdout:  # the launcher logs each job's status changes, job by job in each poll
        lines.append(line)
        if "RUNNING" in "".join(lines) and re.search(r"job 1 .*: PENDING", "".join(lines)):
            break  # job 0 runs and Ray holds job 1 (both seen: a signal between the two log lines cut job 1's)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=300)
    output = "".join(lines) + rest
    assert proc.returncode == 130, output[-3000:]
    assert re.search(r"job 1 .*: PENDING", output)  # Ray held the second job for the one slot
    assert "interrupted: stopping 2 running job(s)" in output
    for num in (0, 1):
        assert (sweep_dir / str(num) / "driver.log").exists()
    assert session_processes() == []
