"""hydra/launcher=ray_jobs: discovery, and a real sweep of Ray Jobs on a local cluster the launcher owns."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import tomllib
from setuptools import find_namespace_packages

from tests.conftest import ROOT, session_processes


def test_plugin_is_discovered_from_the_checkout_and_packaged():
    """`--info plugins` lists it from a checkout; the wheel's package list includes it (namespace package)."""
    proc = subprocess.run(
        [sys.executable, "main.py", "--info", "plugins"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RayJobsLauncher" in proc.stdout
    assert not (ROOT / "hydra_plugins" / "__init__.py").exists()  # Hydra's namespace package has none
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_namespace_packages(where=str(ROOT), include=find["include"])
    assert find.get("namespaces", True) and "hydra_plugins.ray_jobs_launcher" in packages


@pytest.mark.slow
def test_sweep_runs_each_job_as_a_ray_job_and_reports_a_failed_one(tmp_path):
    """Two jobs at once on a 4-CPU-bundle local cluster: job 0 completes, job 1 fails at startup (its
    prompt file has no 'question' key). The failure names the job and its log tail, job 0 still
    finishes with its result.json and objective, and no process of the sweep is left."""
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "main.py",
            "--multirun",
            "hydra/launcher=ray_jobs",
            "hydra.launcher.max_concurrent=2",
            "hydra.launcher.poll_interval_s=0.5",
            "data.input_key=prompt,question",
            "train.num_rollout=1",
            "logger.progress=false",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0  # Hydra's sweeper raises the failed job's error after the batch
    assert "job 1 ['data.input_key=question'" in proc.stderr and "FAILED" in proc.stderr
    assert "data.input_key" in proc.stderr  # the log tail carries the run's own error
    records = json.loads((sweep_dir / "ray_jobs.json").read_text())
    assert [(r["num"], r["status"], r["exit_code"]) for r in records] == [(0, "SUCCEEDED", 0), (1, "FAILED", 3)]
    good = json.loads((sweep_dir / "0" / "result.json").read_text())
    assert good["status"] == "completed" and good["rollouts_completed"] == 1
    assert records[0]["objective"] == good["objective"]
    assert good["objective"]["name"] == "rollout/raw_reward"
    assert good["objective"]["value"] == good["final_metrics"]["rollout/raw_reward"]
    bad = json.loads((sweep_dir / "1" / "result.json").read_text())
    assert (bad["status"], bad["phase"]) == ("failed", "startup")
    for num in (0, 1):  # the job's own log, kept where its run wrote
        assert "Running entrypoint for job" in (sweep_dir / str(num) / "driver.log").read_text()
    assert session_processes() == []
