"""Ctrl-C and SIGTERM: real runs signalled in every phase (the handler policy in a bare process:
tests/driver/test_interrupt_policy.py)."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from slime.rollout.manager.stack_dump import ARMED
from tests.helpers.compose import ROOT
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_argv, main_py_concurrently, selected_runs

# ---------------------------------------------------------------- real runs (Ray, router, engine, trainer)
pytestmark = pytest.mark.timeout(1200)  # the first test waits for the pool of eight runs, on a loaded machine

PHASE_CASES = [
    ("startup", 0.0, "SIGINT", 130),  # before Ray starts
    ("startup", 4.0, "SIGINT", 130),  # while Ray, the router, the engine and the trainer come up
    # while the driver waits in ray.get (which re-raises a bare KeyboardInterrupt); the phase lasts 0.22-0.5 s here
    ("rollout:1", 0.1, "SIGINT", 130),
    ("train:1", 0.0, "SIGINT", 130),
    ("save:1", 0.0, "SIGINT", 130),
    ("weight_sync:1", 0.0, "SIGINT", 130),
]  # SIGTERM from outside, during a run: test_end_to_end.py::test_interrupt_stops_everything


def phase_run(signal_at: str, delay: float, sig: str) -> str:
    return f"{signal_at}_{delay}s_{sig}".replace(":", "_")


def run_of(test: pytest.Item) -> str | None:
    if test.originalname == "test_hung_trainer_rank_is_caught_dumped_and_torn_down":
        return "hung"
    if test.originalname != "test_signal_in_each_phase_tears_down":
        return None
    params = test.callspec.params
    return phase_run(params["signal_at"], params["delay"], params["sig"])


# debug.hang_at puts training rank 0 to sleep forever in train of rollout 1: the watchdog names the phase.
# Start-up, the longest phase, has a limit of its own: on CI, sharing the cores with the runs starting beside it
# and the unit tests, it took 61 s. The hung run's wait overlaps the others' work.
HUNG_RUN = [
    "debug.hang_at=train:1",
    "runtime.phase_timeout_s=60",
    "runtime.startup_timeout_s=600",
    "train.num_rollout=3",
    "checkpoint.save_interval=1",
]


@pytest.fixture(scope="module")
def phase_runs(request, tmp_path_factory) -> dict[str, tuple]:
    """{key: (run dir, finished process)} of the selected runs, three at a time (each signals only itself),
    the hung run first: it waits out its phase timeout while the others run. Returns once every run has
    ended, so no run's processes are left."""
    root = tmp_path_factory.mktemp("phases")
    wanted = selected_runs(request, run_of)
    jobs = {"hung": (root / "hung", HUNG_RUN)} if "hung" in wanted else {}
    for signal_at, delay, sig, _ in PHASE_CASES:
        key = phase_run(signal_at, delay, sig)
        if key in wanted:
            overrides = [
                f"debug.signal_at={signal_at}",
                f"debug.signal={sig}",
                f"debug.signal_delay_s={delay}",
                "train.num_rollout=4",
                "checkpoint.save_interval=2",
            ]
            jobs[key] = (root / key, overrides)
    procs = main_py_concurrently(jobs)
    return {key: (run_dir, procs[key]) for key, (run_dir, _) in jobs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("signal_at,delay,sig,code", PHASE_CASES)
def test_signal_in_each_phase_tears_down(signal_at, delay, sig, code, phase_runs):
    """The signal arrives from another thread while the phase's work is under way, as a Ctrl-C does."""
    run_dir, proc = phase_runs[phase_run(signal_at, delay, sig)]
    assert proc.returncode == code, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "interrupted" and result["error"] == sig
    assert result["phase"] == signal_at.partition(":")[0]
    if signal_at != "startup":
        rollout_id = int(signal_at.partition(":")[2])
        assert result["rollouts_completed"] == rollout_id  # the interrupted rollout is not counted
    assert_no_run_processes()


@pytest.mark.slow
def test_hung_trainer_rank_is_caught_dumped_and_torn_down(phase_runs):
    """The phase watchdog (slime.driver.watchdog; its units: tests/driver/test_watchdog.py) catches a hung trainer
    rank, dumps every process's stacks, names the phase and tears the run down."""
    run_dir, proc = phase_runs["hung"]
    assert proc.returncode == 3, proc.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "hung" and result["phase"] == "train"
    assert result["error"].startswith("phase train of rollout 1 exceeded runtime.phase_timeout_s=60s")
    assert result["rollouts_completed"] == 1
    dumps = {p.name: p.read_text() for p in (run_dir / "stacks").glob("*.txt")}
    assert len(dumps) >= 3, dumps.keys()  # the driver, the rollout manager, the trainer rank
    hung = [text for text in dumps.values() if "_injected_hang" in text]
    assert len(hung) == 1 and "TrainRank" in hung[0].splitlines()[0], dumps
    assert any("RolloutManager" in text.splitlines()[0] for text in dumps.values())
    assert not (run_dir / "stacks" / ARMED).exists()
    assert "watchdog: phase train of rollout 1 exceeded" in proc.stderr
    log = (run_dir / "main.log").read_text()  # the heartbeat: each phase's start, and its end with its time
    assert "phase rollout (rollout 1) started" in log and "phase rollout (rollout 1) done in" in log
    assert "phase log_probs (rollout 1) done in" in log and "phase train (rollout 1) started" in log
    # the checkpoint of rollout 0 is intact
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "0"
    assert result["elapsed_s"] < 900  # start-up, two rollouts and the 60 s limit, on a loaded machine
    assert_no_run_processes()


@pytest.mark.slow
def test_second_ctrl_c_during_teardown_leaves_nothing(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        # tracked: the second signal may land in wandb's finish, whose service must not be left behind
        main_argv(run_dir, "debug.signal_at=rollout:1", "train.num_rollout=4", tracked=True),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    for line in proc.stderr:  # read to the end: a closed pipe would fail the run's own prints
        lines.append(line)
        if "SIGINT received: stopping the run" in line:
            proc.send_signal(signal.SIGINT)  # while the engines, router and Ray are being shut down
    assert proc.wait(timeout=120) == 130, "".join(lines)[-4000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "interrupted" and "forced" in result["error"]
    assert_no_run_processes(timeout_s=5)
