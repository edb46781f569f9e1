"""The suite's cleanup of a `python main.py` run it gave up on (tests.helpers.runs.main_py past its timeout): every
process carrying the run's marker is killed, an orphan included, as vLLM's engine core is once the actor that
launched its server is gone (seen: one kept part of a core busy for the rest of a CI run)."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from tests.helpers.processes import TEST_RUN_VAR, kill_run_processes

ORPHAN = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True,\n"
    "                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "print(child.pid)\n"
)


def test_an_orphan_carrying_the_runs_marker_is_killed_and_others_are_not(tmp_path):
    def orphan(run_id: str) -> psutil.Process:
        env = {**os.environ, TEST_RUN_VAR: run_id}
        out = subprocess.run([sys.executable, "-c", ORPHAN], env=env, capture_output=True, text=True, check=True)
        return psutil.Process(int(out.stdout))  # its parent has exited: it lives on, reparented

    mine, other = orphan(str(tmp_path / "mine")), orphan(str(tmp_path / "other"))
    try:
        assert kill_run_processes(str(tmp_path / "mine")) == [mine.pid]
        mine.wait(timeout=10)
        assert other.is_running() and other.status() != psutil.STATUS_ZOMBIE
    finally:
        other.kill()
