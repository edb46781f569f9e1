"""The driver's weight push when an engine dies under it (slime.runtime.weight_push): the push is made again once
the engine restarted, every engine a push restarted rejoins its router once the weights are in, and without fault
tolerance the failure names the engine. The rollout manager and the trainer are fakes that record the calls;
the real processes: tests/e2e/test_engine_faults.py."""

from __future__ import annotations

import logging

import pytest

from slime.runtime import weight_push
from slime.runtime.deaths import EngineDied
from slime.runtime.events import EventBus, RunEvent
from slime.sync.base import SyncContext
from tests.helpers.compose import typed_config

DEATH = "engine 0 at http://127.0.0.1:1 (pid 7) has no server process; its log: engine_0.log"


class _Call:
    def __init__(self, fn):
        self.remote = fn


class _Fleet:
    """The rollout manager and the trainer: `deaths` engine deaths happen, each as a push begins moving weights."""

    def __init__(self, deaths: int, *, fails_otherwise: bool = False):
        self.deaths_left, self.dead, self.fails_otherwise = deaths, False, fails_otherwise
        self.calls: list[str] = []
        for name in ("engine_control", "dead_engines", "engine_deaths", "recover_engines", "register_engines", "urls"):
            setattr(self, name, _Call(getattr(self, "_" + name)))

    def _engine_control(self, call, *args):
        self.calls.append(call)

    def _dead_engines(self):
        return [0] if self.dead else []

    def _engine_deaths(self):
        return [DEATH] if self.dead else []

    def _recover_engines(self):
        self.calls.append("restart 0")
        self.dead = False
        return [0]

    def _register_engines(self, ranks):
        self.calls.append(f"register {ranks}")

    def _urls(self):
        return ["http://127.0.0.1:1"]

    def connect_weight_sync(self, mode, urls, context):
        self.calls.append("connect")

    def update_weights(self, weight_version):
        if self.deaths_left:
            self.deaths_left -= 1
            self.dead = True
            raise RuntimeError("POST http://127.0.0.1:1/pause_generation: connection failed")
        if self.fails_otherwise:
            raise RuntimeError("a bucket the engine refused")
        self.calls.append(f"update {weight_version}")
        return {"perf/update_weights_time": 0.1}


def _pusher(monkeypatch, fleet: _Fleet, *overrides: str) -> weight_push.WeightPush:
    monkeypatch.setattr(weight_push.ray, "get", lambda value: value)
    cfg = typed_config(list(overrides))
    context = SyncContext(source_checkpoint="/m", work_dir="/w", bucket_bytes=1)
    events = EventBus()
    events.subscribe(RunEvent.PUSH_TRANSFER_STARTED, lambda e: fleet.calls.append(f"transfer {e.rollout_id}"))
    return weight_push.WeightPush(cfg, fleet, fleet, context, events)


FT = "rollout.fault_tolerance.enabled=true"


def test_an_engine_dying_in_a_push_is_restarted_and_the_push_made_again(monkeypatch, caplog):
    fleet = _Fleet(deaths=1)
    with caplog.at_level(logging.WARNING):
        metrics = _pusher(monkeypatch, fleet, FT).sync(weight_version=1)
    assert metrics["rollout/engine_restarts"] == 1.0 and metrics["perf/update_weights_time"] == 0.1
    assert fleet.calls == [
        *("begin_push", "transfer 0", "end_push"),  # the engine died under the first push
        *("begin_push", "restart 0", "connect", "transfer 0", "update 1", "register [0]", "end_push"),
    ]
    assert f"the weight push of version 1 failed: {DEATH} (RuntimeError: POST" in caplog.text
    assert "pushing again to every engine once the engine restarted" in caplog.text


def test_an_engine_restarted_by_a_push_that_then_failed_rejoins_its_router_once(monkeypatch):
    """Dead before the push (restarted by it), then dead again under it: both restarts count, one registration."""
    fleet = _Fleet(deaths=1)
    fleet.dead = True
    metrics = _pusher(monkeypatch, fleet, FT).sync(weight_version=3)
    assert metrics["rollout/engine_restarts"] == 2.0
    assert [c for c in fleet.calls if c.startswith(("restart", "register", "update"))] == [
        "restart 0",
        "restart 0",
        "update 3",
        "register [0]",
    ]


def test_without_fault_tolerance_the_push_fails_naming_the_engine(monkeypatch):
    fleet = _Fleet(deaths=1)
    with pytest.raises(EngineDied) as info:
        _pusher(monkeypatch, fleet).sync(weight_version=1)
    assert str(info.value).startswith(f"the weight push of version 1 failed: {DEATH} (RuntimeError: POST http")
    assert "restart 0" not in fleet.calls and fleet.calls[-1] == "end_push"


def test_past_max_restarts_or_without_a_death_the_error_is_raised(monkeypatch):
    fleet = _Fleet(deaths=2)
    with pytest.raises(EngineDied, match="the weight push of version 2 failed: engine 0 at"):
        _pusher(monkeypatch, fleet, FT, "rollout.fault_tolerance.max_restarts=1").sync(weight_version=2)
    assert fleet.calls.count("restart 0") == 1
    with pytest.raises(RuntimeError, match="a bucket the engine refused"):
        _pusher(monkeypatch, _Fleet(deaths=0, fails_otherwise=True), FT).sync(weight_version=1)
