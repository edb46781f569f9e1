"""The phase watchdog: stack dumps of armed processes (no Ray); a real run with a hung trainer rank is in
tests/e2e/test_interrupts.py (it shares that module's runs, three at a time)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from slime.driver.events import RunEvent
from slime.driver.run_state import RunState
from slime.driver.watchdog import PhaseLimits, Watchdog, dump_stacks, remove_armed
from slime.rollout.manager.stack_dump import ARMED, STACKS_ENV
from tests.helpers.compose import ROOT

SLEEPER = textwrap.dedent("""
    import sys, time
    from slime.rollout.manager.stack_dump import arm_stack_dump

    def sleeping_in_a_phase():
        print("armed", flush=True)
        time.sleep(60)

    arm_stack_dump()
    sleeping_in_a_phase()
""")


def _wait_until(predicate, timeout_s: float = 10.0) -> None:
    """Poll `predicate` every 50 ms until it holds or `timeout_s` passed (the caller's assertion tells which)."""
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_dump_stacks_reads_every_armed_process(tmp_path):
    stacks = tmp_path / "stacks"
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER], cwd=ROOT, env={**os.environ, STACKS_ENV: str(stacks)}, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout.readline() == b"armed\n"
        written = dump_stacks(stacks)
    finally:
        proc.kill()
        proc.wait()
    assert sorted(p.name for p in written) == sorted([f"{os.getpid()}.txt", f"{proc.pid}.txt"])
    actor = (stacks / f"{proc.pid}.txt").read_text()
    assert actor.startswith(f"# pid {proc.pid}: ") and "sleeping_in_a_phase" in actor
    assert "test_dump_stacks_reads_every_armed_process" in (stacks / f"{os.getpid()}.txt").read_text()
    remove_armed(stacks)
    assert not (stacks / ARMED).exists() and (stacks / f"{proc.pid}.txt").exists()


def _started_ago(state: RunState, phase: str, rollout_id: int, seconds: float) -> None:
    """`phase` of `rollout_id` entered `seconds` ago (its start, as the watchdog hears of it)."""
    state.events.publish(RunEvent.PHASE_STARTED, rollout_id, phase=phase, started=time.monotonic() - seconds)


def test_watchdog_fires_once_on_the_overrunning_phase_and_not_in_teardown(tmp_path):
    state, fired = RunState(), []
    dog = Watchdog(
        state.events,
        PhaseLimits(phase_s=2.0),
        tmp_path / "stacks",
        on_fire=fired.append,
        on_stuck=lambda: fired.append("stuck"),
    )
    state.enter("rollout", 0)
    dog.start()
    time.sleep(0.5)
    state.enter("train", 0)
    time.sleep(0.5)
    assert fired == []
    _started_ago(state, "train", 0, 2.5)  # train has now run 2.5 s
    _wait_until(lambda: fired)
    assert fired == [f"phase train of rollout 0 exceeded runtime.phase_timeout_s=2s; stacks in {tmp_path / 'stacks'}"]
    assert (tmp_path / "stacks" / f"{os.getpid()}.txt").exists()
    dog.stop()

    state, fired = RunState(), []
    Watchdog(
        state.events, PhaseLimits(phase_s=0.1), tmp_path / "s2", on_fire=fired.append, on_stuck=lambda: None
    ).start()
    state.enter("save", 1)
    state.enter("teardown")
    time.sleep(0.5)
    assert fired == [] and not (tmp_path / "s2").exists()


def test_watchdog_forces_the_exit_when_the_main_thread_does_not_react(tmp_path):
    state, calls = RunState(), []
    dog = Watchdog(
        state.events,
        PhaseLimits(phase_s=1.0),
        tmp_path / "stacks",
        on_fire=lambda m: calls.append("fire"),
        on_stuck=lambda: calls.append("stuck"),
    )
    _started_ago(state, "weight_sync", 2, 5)
    dog.grace_s = 0.3
    dog.start()
    _wait_until(lambda: len(calls) >= 2)
    assert calls == ["fire", "stuck"]

    state, calls = RunState(), []  # the main thread reacts (teardown begins): no forced exit
    dog = Watchdog(
        state.events,
        PhaseLimits(phase_s=1.0),
        tmp_path / "stacks2",
        on_fire=lambda m: (calls.append("fire"), state.enter("teardown")),
        on_stuck=lambda: calls.append("stuck"),
    )
    _started_ago(state, "eval", 0, 5)
    dog.grace_s = 0.3
    dog.start()
    _wait_until(lambda: calls)
    time.sleep(1.0)  # over three times the grace: a forced exit would have come
    assert calls == ["fire"]


def test_startup_has_its_own_limit_and_the_message_names_its_key(tmp_path):
    """runtime.startup_timeout_s bounds startup only; the other phases keep runtime.phase_timeout_s."""
    state, fired = RunState(), []
    limits = PhaseLimits(phase_s=1.0, startup_s=30.0)
    dog = Watchdog(state.events, limits, tmp_path / "stacks", on_fire=fired.append, on_stuck=lambda: None)
    _started_ago(state, "startup", -1, 5)  # over phase_s, under startup_s
    dog.start()
    time.sleep(0.8)
    assert fired == []
    _started_ago(state, "startup", -1, 31)
    _wait_until(lambda: fired)
    assert fired == [f"phase startup exceeded runtime.startup_timeout_s=30s; stacks in {tmp_path / 'stacks'}"]
    dog.stop()

    assert PhaseLimits(phase_s=None, startup_s=30.0).of("train") == (None, "runtime.phase_timeout_s")
    assert PhaseLimits(phase_s=60.0).of("startup") == (60.0, "runtime.phase_timeout_s")
    assert not PhaseLimits(phase_s=None).armed
