"""The driver's weight push when an engine dies under it (slime.driver.weight_push): the push is made again once
the engine restarted, every engine a push restarted rejoins its router once the weights are in, and without fault
tolerance the failure names the engine; the log-prob probe ends each push (colocated, the trainer scores it at its
onload). The rollout manager and the trainer are fakes that record the calls; the real processes:
tests/e2e/test_engine_faults.py, the probe's parts against a real vLLM: tests/engine/vllm/test_vllm_server.py."""

from __future__ import annotations

import logging

import pytest
from ray.exceptions import RayTaskError

from slime.driver import weight_push
from slime.driver.events import EventBus, RunEvent
from slime.rollout.manager.deaths import EngineDied
from slime.sync.base import SyncContext, WeightMismatchError
from slime.sync.probe import EngineProbe
from tests.helpers.compose import typed_config

URL = "http://127.0.0.1:1"
DEATH = "engine 0 at http://127.0.0.1:1 (pid 7) has no server process; its log: engine_0.log"


class _Call:
    def __init__(self, fn):
        self.remote = fn


class _Fleet:
    """The rollout manager and the trainer: `deaths` engine deaths happen, each as a push begins moving weights."""

    def __init__(self, deaths: int, *, fails_otherwise: bool = False, mismatches: int = 0, probe_gaps=(), checks=()):
        self.deaths_left, self.dead, self.fails_otherwise = deaths, False, fails_otherwise
        self.checks = list(checks)  # per deferred check in turn: "ok", "mismatch" or "death" (then "ok")
        self.mismatches_left = mismatches  # pushes whose verification finds engine 0's weights wrong
        self.probe_gaps = list(probe_gaps)  # per probe in turn: the trainer's log-probs minus the engine's (then 0)
        self.calls: list[str] = []
        names = ("engine_control", "dead_engines", "engine_deaths", "recover_engines", "register_engines", "urls")
        for name in (*names, "mark_engines_dead", "probe_engines"):
            setattr(self, name, _Call(getattr(self, "_" + name)))

    def _probe_engines(self, max_new_tokens):
        self.calls.append(f"probe {max_new_tokens}")
        return [EngineProbe(URL, [3, 4], [-1.0, -2.0])], ["shard 0"]

    def load_batch(self, rollout_id, shards):
        self.calls.append(f"score {rollout_id} {shards}")

    def compute_log_probs(self, which):
        assert which == "old"

    def get_column(self, name):
        gap = self.probe_gaps.pop(0) if self.probe_gaps else 0.0
        return [[[-1.0 + gap, -2.0 + gap]]]  # per shard, per sample

    def _mark_engines_dead(self, urls, why):
        self.calls.append(f"mark dead {urls}: {why}")
        self.dead = True
        return [0]

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
        if self.mismatches_left:  # as the trainer's ray.get raises it: Ray's task error, an instance of its cause
            self.mismatches_left -= 1
            cause = WeightMismatchError(f"engine {URL} holds other weights than ...: model.norm.weight", [URL])
            raise RayTaskError("call", f"Traceback ...\n{cause}", cause).as_instanceof_cause()
        self.calls.append(f"update {weight_version}")
        return {"perf/update_weights_time": 0.1}

    def weights_verified(self):
        outcome = self.checks.pop(0) if self.checks else "ok"
        self.calls.append(f"verified {outcome}")
        if outcome == "mismatch":
            cause = WeightMismatchError(f"engine {URL} holds other weights than ...: model.norm.weight", [URL])
            raise RayTaskError("call", f"Traceback ...\n{cause}", cause).as_instanceof_cause()
        if outcome == "death":
            self.dead = True
            raise RuntimeError(f"GET {URL}/weight_digests: connection failed")
        return {"perf/update_weights_verify_time": 0.01}


def _pusher(monkeypatch, fleet: _Fleet, *overrides: str, defer: bool = False) -> weight_push.WeightPush:
    monkeypatch.setattr(weight_push.ray, "get", lambda value: value)
    cfg = typed_config(list(overrides))
    context = SyncContext(source_checkpoint="/m", work_dir="/w", bucket_bytes=1, defer_verify=defer)
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
        *("probe 16", "score 1 ['shard 0']"),  # the probe of the push that succeeded
    ]
    assert metrics["rollout/weight_probe_logprob_diff"] == 0.0
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


def test_on_mismatch_resync_restarts_the_engine_a_verification_named_and_pushes_again(monkeypatch, caplog):
    fleet = _Fleet(deaths=0, mismatches=1)
    with caplog.at_level(logging.WARNING):
        metrics = _pusher(monkeypatch, fleet, "rollout.weight_sync.on_mismatch=resync").sync(weight_version=4)
    assert metrics["rollout/engine_restarts"] == 1.0
    why = "holds other weights than the trainer pushed as version 4"
    assert fleet.calls == [
        *("begin_push", "transfer 3", "end_push", f"mark dead ['{URL}']: {why}"),
        *("begin_push", "restart 0", "connect", "transfer 3", "update 4", "register [0]", "end_push"),
        *("probe 16", "score 4 ['shard 0']"),
    ]
    assert f"engine 0 {why}: restarted to be synced again" in caplog.text


PROBED = "the log-prob probe after the push of version"


def test_a_probe_whose_log_probs_differ_fails_the_push_naming_the_engine_and_its_token(monkeypatch):
    """fp32 on CPU: a mean difference above 1e-3 is another model; the error names the engine, the figures and the
    worst token. At or under the tolerance the push passes with the difference as its metric."""
    fleet = _Fleet(deaths=0, probe_gaps=[0.5])
    with pytest.raises(WeightMismatchError) as info:
        _pusher(monkeypatch, fleet).sync(weight_version=2)
    assert info.value.urls == (URL,)
    assert str(info.value) == (
        f"{PROBED} 2: the engines compute other log-probs than the trainer on the weights it pushed: engine {URL}: "
        "mean |log-prob difference| 0.5 over 2 tokens (tolerance 0.001); token 0 (id 3): engine -1.0000, trainer -0.5000"
    )
    metrics = _pusher(monkeypatch, _Fleet(deaths=0, probe_gaps=[1e-3])).sync(weight_version=2)
    assert metrics["rollout/weight_probe_logprob_diff"] == pytest.approx(1e-3)
    assert metrics["perf/update_weights_probe_time"] >= 0
    loose = _pusher(monkeypatch, _Fleet(deaths=0, probe_gaps=[0.5]), "rollout.weight_sync.probe_tolerance=0.6")
    assert loose.sync(weight_version=2)["rollout/weight_probe_logprob_diff_max"] == pytest.approx(0.5)


def test_no_probe_with_probe_tokens_0_or_verification_off(monkeypatch):
    for off in ("rollout.weight_sync.probe_tokens=0", "rollout.weight_sync.verify=false"):
        fleet = _Fleet(deaths=0, probe_gaps=[0.5])
        assert "rollout/weight_probe_logprob_diff" not in _pusher(monkeypatch, fleet, off).sync(weight_version=1)
        assert not any(c.startswith(("probe", "score")) for c in fleet.calls)


def test_on_mismatch_resync_restarts_the_engine_a_probe_named_and_pushes_again(monkeypatch):
    fleet = _Fleet(deaths=0, probe_gaps=[0.5])
    metrics = _pusher(monkeypatch, fleet, "rollout.weight_sync.on_mismatch=resync").sync(weight_version=5)
    assert metrics["rollout/engine_restarts"] == 1.0 and metrics["rollout/weight_probe_logprob_diff"] == 0.0
    assert fleet.calls[fleet.calls.index("probe 16") :] == [
        *(
            "probe 16",
            "score 5 ['shard 0']",
            f"mark dead ['{URL}']: holds other weights than the trainer pushed as version 5",
        ),
        *("begin_push", "restart 0", "connect", "transfer 4", "update 5", "register [0]", "end_push"),
        *("probe 16", "score 5 ['shard 0']"),
    ]


def test_colocated_the_trainer_scores_the_probe_at_its_onload_and_a_resync_restarts_in_the_next_push(monkeypatch):
    """Colocated, the trainer is off the device after a push: the engines answer the probe then, the trainer scores
    it once onloaded (before_train), with its metrics; a mismatch there marks the engine dead (resync), and the next
    push restarts it; without resync it stops the run."""
    colocated = ("cluster.colocate=true",)
    fleet = _Fleet(deaths=0, probe_gaps=[0.0, 0.5])
    pusher = _pusher(monkeypatch, fleet, *colocated, "rollout.weight_sync.on_mismatch=resync")
    pusher.actor.offload = pusher.actor.onload = lambda: None
    assert "rollout/weight_probe_logprob_diff" not in pusher.sync(weight_version=1)
    assert fleet.calls[-1] == "probe 16"
    assert pusher.before_train(1)["rollout/weight_probe_logprob_diff"] == 0.0
    assert fleet.calls[-1] == "score 1 ['shard 0']"
    pusher.sync(weight_version=2)
    assert pusher.before_train(2) == {} and fleet.calls[-1].startswith(f"mark dead ['{URL}']")
    before = len(fleet.calls)
    assert pusher.sync(weight_version=3)["rollout/engine_restarts"] == 1.0
    assert fleet.calls[before:][:2] == ["begin_push", "restart 0"]
    failing = _pusher(monkeypatch, _Fleet(deaths=0, probe_gaps=[0.5]), *colocated)
    failing.actor.offload = failing.actor.onload = lambda: None
    failing.sync(weight_version=1)
    with pytest.raises(WeightMismatchError, match=PROBED):
        failing.before_train(1)


def test_on_mismatch_fail_stops_at_the_mismatch_and_resync_stops_past_max_restarts(monkeypatch):
    fleet = _Fleet(deaths=0, mismatches=1)
    with pytest.raises(WeightMismatchError, match="model.norm.weight"):
        _pusher(monkeypatch, fleet, FT).sync(weight_version=2)  # fault tolerance alone does not resync
    assert not any(c.startswith(("mark dead", "restart")) for c in fleet.calls)
    resync = ("rollout.weight_sync.on_mismatch=resync", "rollout.fault_tolerance.max_restarts=1")
    with pytest.raises(EngineDied, match="holds other weights than the trainer pushed as version 2"):
        _pusher(monkeypatch, _Fleet(deaths=0, mismatches=2), *resync).sync(weight_version=2)


def test_a_deferred_check_is_awaited_before_training_and_its_mismatch_stops_the_run(monkeypatch):
    """on_mismatch=fail: the loop's push returns with its check still running on the trainer (beside the next
    rollout); `await_verification` (before the step trains) gives its seconds, or raises its mismatch, once. A push
    awaits a check nothing awaited first; a push the loop needs checked at once (`defer=False`) is awaited in it."""
    fleet = _Fleet(deaths=0, checks=["ok", "mismatch"])
    pusher = _pusher(monkeypatch, fleet, "rollout.weight_sync.probe_tokens=0", defer=True)
    metrics = pusher.sync(weight_version=1)
    assert "perf/update_weights_verify_time" not in metrics and fleet.calls[-1] == "end_push"
    assert pusher.await_verification() == {"perf/update_weights_verify_time": 0.01}
    assert pusher.await_verification() == {} and fleet.calls.count("verified ok") == 1
    pusher.sync(weight_version=2)
    with pytest.raises(WeightMismatchError, match="model.norm.weight"):
        pusher.await_verification()
    assert not any(c.startswith(("mark dead", "restart")) for c in fleet.calls)
    pusher.sync(weight_version=3)
    assert pusher.sync(weight_version=4)["perf/update_weights_verify_time"] == 0.01  # version 3's, awaited first
    assert fleet.calls[-2:] == ["update 4", "end_push"]
    assert pusher.sync(weight_version=5, defer=False)["perf/update_weights_verify_time"] == 0.01
    assert fleet.calls[-1] == "verified ok" and pusher.await_verification() == {}


def test_a_deferred_push_asks_for_its_probe_and_scores_it_when_its_check_is_awaited(monkeypatch):
    """Where the check runs beside generation, so does the probe: the push asks the engines for it once generation
    continued (their answers come beside the next rollout's), and the trainer scores them when the check is awaited,
    before the step trains; a probe that differs then stops the run."""
    fleet = _Fleet(deaths=0, probe_gaps=[0.0, 0.5])
    pusher = _pusher(monkeypatch, fleet, defer=True)
    metrics = pusher.sync(weight_version=1)
    assert "rollout/weight_probe_logprob_diff" not in metrics and fleet.calls[-2:] == ["end_push", "probe 16"]
    assert not any(call.startswith("score") for call in fleet.calls)
    awaited = pusher.await_verification()
    assert awaited["rollout/weight_probe_logprob_diff"] == 0.0 and awaited["perf/update_weights_probe_time"] >= 0
    assert fleet.calls[-2:] == ["verified ok", "score 1 ['shard 0']"]
    pusher.sync(weight_version=2)
    with pytest.raises(WeightMismatchError, match=f"{PROBED} 2"):
        pusher.await_verification()
    assert pusher.await_verification() == {}


def test_a_deferred_check_an_engine_death_cut_short_is_left_to_the_restart(monkeypatch, caplog):
    """With fault tolerance, a check that failed because an engine died is no mismatch: the warning names the death,
    and the next push restarts the engine; without fault tolerance the error stops the run."""
    fleet = _Fleet(deaths=0, checks=["death"])
    pusher = _pusher(monkeypatch, fleet, FT, "rollout.weight_sync.probe_tokens=0", defer=True)
    pusher.sync(weight_version=1)
    with caplog.at_level(logging.WARNING):
        assert pusher.await_verification() == {}
    assert f"the check of the last push did not finish: {DEATH} (RuntimeError: GET" in caplog.text
    assert pusher.sync(weight_version=2)["rollout/engine_restarts"] == 1.0
    failing = _pusher(monkeypatch, _Fleet(deaths=0, checks=["death"]), "rollout.weight_sync.probe_tokens=0", defer=True)
    failing.sync(weight_version=1)
    with pytest.raises(RuntimeError, match="weight_digests: connection failed"):
        failing.await_verification()


def test_colocated_the_check_ends_before_the_engines_release_their_weights(monkeypatch):
    """Colocated, the engines give their memory back before the step trains: the push's check, running beside the
    rollout, is awaited first (a released engine holds no weights to check), and its seconds come with the step."""
    fleet = _Fleet(deaths=0)
    pusher = _pusher(monkeypatch, fleet, "cluster.colocate=true", "rollout.weight_sync.probe_tokens=0", defer=True)
    pusher.actor.offload = pusher.actor.onload = lambda: None
    pusher.sync(weight_version=1)
    assert pusher.before_train(1) == {"perf/update_weights_verify_time": 0.01}
    assert fleet.calls[-2:] == ["verified ok", "release_memory"]


def test_a_steps_record_keeps_both_checks_when_the_last_push_is_checked_inside_it():
    """The last step awaited the check of the push before it (its figures already in the record) and its own push is
    checked at once: check times add up, the probe keeps the larger difference, the push's own figures are its."""
    record = {"perf/update_weights_verify_time": 0.01, "rollout/weight_probe_logprob_diff": 2e-7, "perf/x": 1.0}
    pushed = {"perf/update_weights_verify_time": 0.02, "rollout/weight_probe_logprob_diff": 1e-7, "perf/x": 3.0}
    weight_push.merge_checks(record, {**pushed, "perf/update_weights_time": 0.5})
    assert record == {
        "perf/update_weights_verify_time": pytest.approx(0.03),
        "rollout/weight_probe_logprob_diff": 2e-7,
        "perf/x": 3.0,
        "perf/update_weights_time": 0.5,
    }
