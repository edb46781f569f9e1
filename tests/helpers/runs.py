"""`python main.py` as the tests run it: the command line, one run or a pool of them, what a run wrote (rewards,
metrics, engines.json), and a run a bad config must stop in validation."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import PIPE
from typing import TypeVar

import pytest
import yaml

from tests.helpers.compose import ROOT
from tests.helpers.processes import TEST_RUN_VAR, TreeCpu, kill_run_processes, session_processes


def main_argv(run_dir, *overrides: str, tracked: bool = False, progress: bool = False) -> list[str]:
    """`python main.py` writing to `run_dir`, as a test runs it: without what the test does not check.

    No progress display unless `progress`; no wandb run and no end-of-run plots unless `tracked` (wandb's
    service and matplotlib cost ~5 CPU-seconds a run, a fifth of a short run's on 2 cores; the runs of
    test_end_to_end.py keep both, as shipped, and check them)."""
    quiet = [] if progress else ["logger.progress=false"]
    if not tracked:
        quiet += ["logger.wandb.mode=disabled", "logger.plot=false"]
    return [sys.executable, "main.py", f"hydra.run.dir={run_dir}", *quiet, *overrides]


def two_epochs(data: Path, *, prompts: int = 16, batch_size: int = 4) -> list[str]:
    """Overrides for a run of two epochs over the first `prompts` prompts of the prompt file `data`, `batch_size`
    groups a step (the run's length follows: train.num_epoch sizes it)."""
    return [
        f"data.prompt_data='{data}@[0:{prompts}]'",
        "data.generator=null",
        "train.num_rollout=null",
        "train.num_epoch=2",
        "train.global_batch_size=null",
        f"rollout.batch_size={batch_size}",
    ]


T = TypeVar("T")


def main_py(run_dir: Path, *overrides: str, timeout: float = 600, tracked: bool = False) -> subprocess.CompletedProcess:
    """`main.py` to its end (see `main_argv`: `tracked` keeps the wandb run and the plots). Past `timeout` the
    run and everything it started are killed (TimeoutExpired): nothing of it keeps a core busy for later tests."""
    return run_argv(main_argv(run_dir, *overrides, tracked=tracked), str(run_dir), timeout=timeout)


def run_argv(argv: list[str], run_id: str, *, timeout: float = 600) -> subprocess.CompletedProcess:
    """`argv` (a main.py command, or one wrapping it) to its end, as `main_py` runs it: its processes marked with
    `run_id`, killed past `timeout`; `cpu_s` on the result."""
    env = {**os.environ, TEST_RUN_VAR: run_id}
    with subprocess.Popen(argv, cwd=ROOT, stdout=PIPE, stderr=PIPE, text=True, env=env) as proc:
        meter = TreeCpu(proc.pid)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            meter.stop()
            kill_run_processes(run_id)
            proc.kill()
            raise
    done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    done.cpu_s = meter.stop()  # CPU seconds of the run's processes (tests/helpers/metric_history.py records it)
    return done


def run_concurrently(jobs: dict[str, Callable[[], T]], *, max_workers: int = 3, stagger_s: float = 5.0) -> dict[str, T]:
    """Each job (a function starting runs and waiting for them), `max_workers` at a time, in the order given
    (put the longest first): a short run is mostly start-up waits (Ray, actors, engine health), which overlap.
    The first jobs start `stagger_s` apart: Ray gives a new node's raylet 30 s to register, which several
    clusters starting at the same instant on 2 busy cores can exceed. Returns {key: the job's result} once
    every job has ended, so no run's processes are left."""

    def staggered(index: int, job: Callable[[], T]) -> T:
        time.sleep(stagger_s * index if index < max_workers else 0.0)  # later jobs start as earlier ones end
        return job()

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers)
    futures = {key: pool.submit(staggered, index, job) for index, (key, job) in enumerate(jobs.items())}
    try:
        return {key: future.result() for key, future in futures.items()}
    finally:
        # On pytest-timeout's interrupt the jobs not yet started are dropped (a pool's shutdown would start
        # every one of them); the running ones end within their own timeouts.
        pool.shutdown(wait=True, cancel_futures=True)


def main_py_concurrently(
    runs: dict[str, tuple[Path, list[str]]], *, max_workers: int = 3, timeout: float = 600
) -> dict[str, subprocess.CompletedProcess]:
    """`main_py(run_dir, *overrides)` for each {key: (run_dir, overrides)}, through `run_concurrently`."""
    jobs = {
        key: functools.partial(main_py, run_dir, *overrides, timeout=timeout)
        for key, (run_dir, overrides) in runs.items()
    }
    return run_concurrently(jobs, max_workers=max_workers)


def selected_runs(request: pytest.FixtureRequest, run_of: Callable[[pytest.Item], str | None]) -> set[str]:
    """The keys of the runs that this module's collected tests need (`run_of(test)`; None: no shared run), so
    that a -k selection starts only the runs it checks."""
    return {key for item in request.session.items if item.module is request.module and (key := run_of(item))}


def rewards(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["rollout/raw_reward"] for r in records if "rollout/raw_reward" in r]


def metrics(run_dir: Path) -> dict[int, dict]:
    """Per rollout id, the merged rollout-level metrics."""
    merged: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "rollout/raw_reward" in record:
            merged.setdefault(record["rollout/step"], {}).update(record)
    return merged


def checkpoint_gib(run_dir: Path) -> float:
    """GiB of the tensors in the safetensors files of the run's `model.hf_checkpoint` (its config.yaml)."""
    from safetensors.torch import load_file

    checkpoint = Path(yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["hf_checkpoint"])
    return sum(t.nbytes for path in checkpoint.glob("*.safetensors") for t in load_file(path).values()) / 2**30


def engine_of(run_dir: Path, rank: int, timeout_s: float = 300) -> dict:
    """Engine `rank`'s entry of engines.json once the run wrote it."""
    deadline = time.monotonic() + timeout_s
    while not (run_dir / "engines.json").exists():
        assert time.monotonic() < deadline, "engines.json never written"
        time.sleep(0.05)
    return json.loads((run_dir / "engines.json").read_text())["engines"][rank]


def run_main(*args: str, cwd: Path = ROOT, env: dict | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """main.py under `-X importtime`: (the finished process, the top-level packages it imported)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "main.py", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+([\w.]+)$", proc.stderr, flags=re.M))
    proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    return proc, {name.split(".")[0] for name in imported}


def assert_stopped_in_validation(proc: subprocess.CompletedProcess, imported: set[str]) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("Configuration error: invalid configuration") == 1, proc.stderr
    assert "ray" not in imported and "sglang" not in imported
    assert session_processes() == []
