"""Rollout progress by groups: the default rollout's counts, the manager's answer while it generates, the display."""

from __future__ import annotations

import io
import logging
import time

import pytest
from rich.console import Console

from slime.driver.events import RunEvent
from slime.driver.loop import RunLoop, RunParts, Step
from slime.driver.run_state import RunState
from slime.rollout.base import RolloutProgress
from slime.rollout.manager.actor import ACTOR_OPTIONS, RolloutManager
from slime.tracking.progress import RunProgress
from tests.helpers.compose import typed_config

COUNTS = {"needed": 4, "kept": 1, "submitted": 6, "in_flight": 5, "dropped": 0}


def test_live_display_has_a_group_bar_while_generating():
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    progress = RunProgress(total=5, live=True, console=console)
    progress.start()
    progress.begin(0)
    assert progress.poll_s == 0.5
    progress.on_phase("rollout", 0)
    progress.rollout_groups(0, {**COUNTS, "dropped": 2})
    bar = progress.display.tasks[1]
    assert (bar.visible, bar.completed, bar.total, bar.fields["label"]) == (True, 1, 4, " groups")
    assert bar.description == "6 drawn, 5 in flight, 2 filtered"
    progress.rollout_groups(0, {**COUNTS, "kept": 4, "in_flight": 2}, final=True)
    assert (bar.completed, bar.description) == (4, "6 drawn, 2 cut, 0 filtered")
    progress.on_phase("train", 0)
    assert not bar.visible  # the group bar belongs to generation
    progress.close()


def test_off_a_terminal_group_counts_are_logged_every_interval_and_at_the_end_of_a_slow_rollout(monkeypatch, caplog):
    """Not on the console (one line per rollout step there): records of the slime.tracking.progress logger (main.log)."""
    out = io.StringIO()
    clock = iter([0.0, 10.0, 12.0, 20.5, 21.0, 30.0, 30.5, 31.0])
    monkeypatch.setattr("slime.tracking.progress.time.monotonic", lambda: next(clock))
    caplog.set_level(logging.INFO, logger="slime.tracking.progress")
    progress = RunProgress(total=5, live=False, console=Console(file=out, width=120), slow_phase_s=10)
    assert progress.poll_s == 10
    progress.on_phase("rollout", 0)  # t=0
    progress.rollout_groups(0, COUNTS)  # t=10: printed
    progress.rollout_groups(0, {**COUNTS, "kept": 2})  # t=12: 2 s after the last line, not printed
    progress.rollout_groups(0, {**COUNTS, "kept": 3})  # t=20.5: printed
    progress.rollout_groups(0, {**COUNTS, "kept": 4, "in_flight": 2}, final=True)  # t=21: a slow rollout's end
    progress.on_phase("rollout", 1)  # t=30 (the rollout phase lasted 30 s: its own line)
    progress.rollout_groups(1, {**COUNTS, "kept": 4}, final=True)  # t=30.5: a fast rollout, no line
    progress.rollout_groups(1, dict.fromkeys(COUNTS, 0), final=True)  # no counts reported (sft): nothing shown
    progress.close()
    assert [r.getMessage() for r in caplog.records if r.name == "slime.tracking.progress"] == [
        "rollout 0: 1/4 groups kept, 6 drawn, 5 in flight, 0 filtered",
        "rollout 0: 3/4 groups kept, 6 drawn, 5 in flight, 0 filtered",
        "rollout 0: 4/4 groups kept, 6 drawn, 2 cut, 0 filtered",
        "rollout 0 generating took 30.0s",
    ]
    assert out.getvalue() == ""
    assert RunProgress(total=5, live=False, groups=False, console=Console(file=out)).poll_s is None


@pytest.mark.slow
def test_the_manager_answers_progress_while_it_generates():
    import ray

    class _Generating(RolloutManager):
        """The real manager's `progress` and actor options; `generate` keeps a group every 0.3 s, like a
        rollout. Defined in the test, so that Ray pickles it by value."""

        def __init__(self):
            self.rollout_progress = (-1, RolloutProgress())

        def generate(self, rollout_id):
            counts = RolloutProgress(needed=4, submitted=6, in_flight=6)
            self.rollout_progress = (rollout_id, counts)
            for kept in range(1, 5):
                time.sleep(0.3)
                counts.kept, counts.in_flight = kept, 6 - kept
            return ["batches"], {}, []

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        manager = ray.remote(**ACTOR_OPTIONS)(_Generating).remote()
        state, seen = RunState(), []  # the group counts the loop published (RunEvent.ROLLOUT_PROGRESS)
        state.events.subscribe(
            RunEvent.ROLLOUT_PROGRESS, lambda e: seen.append((e.rollout_id, e.data["counts"], e.data["final"]))
        )
        parts = RunParts(cfg=typed_config([]), state=state, manager=manager, tracker=None, group_poll_s=0.05)
        run_loop = RunLoop(parts, 3)
        step = Step(3)
        run_loop.receive(step, run_loop.generate(3))
        assert step.shards == ["batches"]  # the shard references, as the manager returned them
        assert {rollout_id for rollout_id, _, _ in seen} == {3}
        assert seen[-1] == (3, {**COUNTS, "kept": 4, "in_flight": 2}, True)
        during = sorted({counts["kept"] for _, counts, final in seen if not final})
        assert during and during[0] < 4  # answered mid-rollout, not queued behind generate
    finally:
        ray.shutdown()


def test_progress_interval_must_not_be_negative():
    from slime.plan.validate import collect_problems

    cfg = typed_config(["logger.progress_every_s=-1"])
    assert [(p.key, "must be >= 0" in str(p)) for p in collect_problems(cfg)] == [("logger.progress_every_s", True)]
