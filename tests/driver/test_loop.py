"""The run loop (slime.driver.loop): its shape, the events both loops publish, and the fault injector."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from slime.driver import fault_injection
from slime.driver.events import RunEvent
from slime.driver.fault_injection import FaultInjector
from slime.driver.loop import RunLoop, RunParts
from slime.driver.run_state import RunState
from slime.rollout.manager.deaths import EngineDied, RouterDied
from tests.helpers.compose import ROOT, typed_config
from tests.helpers.fake_run_world import FakeWorld, Remote, eager_ray

# The two processes' packages: the driver's and the rollout manager's.
PROCESS_PACKAGES = {
    "slime.driver": ROOT / "slime" / "driver",
    "slime.rollout.manager": ROOT / "slime" / "rollout" / "manager",
}
MAX_PARAMETERS = 5


# ---- shape ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", [RunLoop.run_sync, RunLoop.run_async, RunLoop.run_rollout_only])
def test_each_loop_reads_on_one_screen(loop):
    assert len(inspect.getsource(loop).splitlines()) < 40


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Every parameter by name (positional, keyword-only, *args, **kwargs), `self`/`cls` left out."""
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return names[1:] if names and names[0] in ("self", "cls") else names


def test_parameter_count_sees_every_kind_of_parameter():
    tree = ast.parse("def f(self, a, /, b, *args, c, d=1, **kw): pass")
    assert _parameters(tree.body[0]) == ["a", "b", "c", "d", "args", "kw"]


def test_no_process_function_takes_more_than_five_parameters():
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({', '.join(_parameters(node))})"
        for folder in PROCESS_PACKAGES.values()
        for path in sorted(folder.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and len(_parameters(node)) > MAX_PARAMETERS
    ]
    assert offenders == []


def _process_imports(path: Path) -> set[str]:
    """The modules of the process packages that `path` imports, at module level or inside functions."""
    found = set()
    inside = lambda name: any(name.startswith(f"{package}.") for package in PROCESS_PACKAGES)  # noqa: E731
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module in PROCESS_PACKAGES:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and inside(node.module or ""):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if inside(a.name))
    return found


def test_no_import_cycle_inside_the_process_packages():
    graph = {
        f"{package}.{p.stem}": _process_imports(p)
        for package, folder in PROCESS_PACKAGES.items()
        for p in folder.glob("*.py")
    }
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


# ---- the events both loops publish ---------------------------------------------------------------------------


def _events(which, overrides: list[str], monkeypatch, *, actor=True) -> list[tuple[str, int | None, str]]:
    """(event, rollout id, phase) of every event `which` publishes over three rollouts of the fake world."""
    eager_ray(monkeypatch)
    world, state, seen = FakeWorld(), RunState(), []
    state.events.subscribe(tuple(RunEvent), lambda e: seen.append((e.kind.value, e.rollout_id, e.data.get("phase"))))
    parts = RunParts(cfg=typed_config(["train.num_rollout=3", *overrides]), state=state, manager=world, tracker=world)
    if actor:
        parts = dataclasses.replace(parts, actor=world, pusher=world)
    RunLoop(parts, 0).run()
    assert state.rollouts_completed == 3
    return seen


def _of(events, rollout_id: int) -> list[tuple[str, str]]:
    return [(kind, phase) for kind, rid, phase in events if rid == rollout_id]


SYNC_STEP = [
    ("phase_started", "rollout"),
    ("rollout_started", None),
    ("rollout_done", None),
    ("phase_started", "log_probs"),
    ("phase_started", "train"),
    ("train_done", None),
    ("phase_started", "weight_sync"),
    ("weights_pushed", None),
    ("step_done", None),
]
SAVE = [("phase_started", "save"), ("checkpoint_data_saved", None), ("checkpoint_saved", None)]


def test_sync_loop_publishes_each_step_of_a_rollout(monkeypatch):
    events = _events(RunLoop.run_sync, [], monkeypatch)
    assert events[:3] == [
        ("loop_started", None, None),
        ("phase_started", -1, "weight_sync"),
        ("weights_pushed", -1, None),
    ]
    assert _of(events, 0) == _of(events, 1) == SYNC_STEP
    assert _of(events, 2) == SYNC_STEP[:6] + SAVE + SYNC_STEP[6:]  # the last step is saved


def test_async_loop_publishes_the_same_events_as_the_sync_loop(monkeypatch):
    """Per rollout id, the same events; the next rollout is started while the step trains."""
    sync = _events(RunLoop.run_sync, [], monkeypatch)
    asynchronous = _events(RunLoop.run_async, ["train.async=true"], monkeypatch)
    for rollout_id in (-1, 0, 1, 2):
        assert sorted(_of(asynchronous, rollout_id)) == sorted(_of(sync, rollout_id))
    started = [i for i, e in enumerate(asynchronous) if e[0] == "rollout_started"]
    trained = [i for i, e in enumerate(asynchronous) if e[0] == "train_done"]
    assert started[1] < trained[0] and started[2] < trained[1]


def test_rollout_only_uses_the_same_steps_without_a_trainer(monkeypatch):
    overrides = ["eval=digit_task", "eval.interval=2"]
    events = _events(RunLoop.run_rollout_only, overrides, monkeypatch, actor=False)
    step = [("phase_started", "rollout"), ("rollout_started", None), ("rollout_done", None), ("step_done", None)]
    evaluation = [("phase_started", "eval"), ("eval_done", None)]
    assert _of(events, -1) == evaluation  # eval before the first rollout
    assert _of(events, 0) == step and _of(events, 1) == step + evaluation and _of(events, 2) == step


# ---- fault injection (debug.signal_at, debug.hang_at) --------------------------------------------------------


class _Trainer:
    def __init__(self):
        self.ran: list[tuple[int, str]] = []

    def run_on_rank(self, rank, fn):
        self.ran.append((rank, fn.__name__))

    def run_on_backends(self, fn):
        self.ran.append(("every rank", fn.__name__))


def _injector(*overrides: str, run_dir: Path = Path("/nonexistent")) -> tuple[RunState, _Trainer]:
    state, trainer = RunState(), _Trainer()
    assert FaultInjector.attach(typed_config(list(overrides)).debug, state.events, run_dir) is not None
    state.events.publish(RunEvent.LOOP_STARTED, start=0, trainer=trainer)
    return state, trainer


def test_no_injector_without_a_debug_option():
    state = RunState()
    assert FaultInjector.attach(typed_config([]).debug, state.events, Path("/nonexistent")) is None


def test_hang_at_a_save_hangs_once_its_data_source_state_is_written():
    state, trainer = _injector("debug.hang_at=save:1")
    state.enter("save", 0)
    state.events.publish(RunEvent.CHECKPOINT_DATA_SAVED, 0)
    state.enter("save", 1)
    assert trainer.ran == []  # entering the save is not enough
    state.events.publish(RunEvent.CHECKPOINT_DATA_SAVED, 1)
    state.events.publish(RunEvent.CHECKPOINT_DATA_SAVED, 1)
    assert trainer.ran == [(0, "_injected_hang")]  # once


def test_hang_at_a_phase_of_any_rollout():
    state, trainer = _injector("debug.hang_at=train")
    state.enter("log_probs", 0)
    assert trainer.ran == []
    state.enter("train", 0)
    state.enter("train", 1)
    assert trainer.ran == [(0, "_injected_hang")]


def test_signal_at_sends_the_signal_once_after_its_delay(monkeypatch):
    sent = []
    monkeypatch.setattr(fault_injection, "_send_signal", sent.append)
    state, _ = _injector("debug.signal_at=rollout:2", "debug.signal=SIGTERM", "debug.signal_delay_s=0.1")
    state.enter("rollout", 1)
    state.enter("rollout", 2)
    state.enter("rollout", 2)
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # a second signal would have come by now
    assert sent == [signal.SIGTERM]


def test_a_hang_comes_after_every_other_subscriber_heard_of_the_phase():
    """The watchdog subscribes after the injector (launch.py) and must still hear of the phase that hangs."""
    state, trainer = _injector("debug.hang_at=train:0")
    heard = []
    state.events.subscribe(RunEvent.PHASE_STARTED, lambda e: heard.append((e.data["phase"], len(trainer.ran))))
    state.enter("train", 0)
    assert heard == [("train", 0)] and trainer.ran == [(0, "_injected_hang")]


def test_nonfinite_at_poisons_every_rank_once_in_its_train_phase():
    state, trainer = _injector("debug.nonfinite_at=train:1")
    state.enter("train", 0)
    state.enter("rollout", 1)
    assert trainer.ran == []
    state.enter("train", 1)
    state.enter("train", 1)
    assert trainer.ran == [("every rank", "_poison_next_gradient")]


def _sleeper() -> subprocess.Popen:
    """A process standing for an engine's server or a router: one a kill hook may kill."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.mark.parametrize("hook", ["kill_engine_at", "kill_router_at"])
def test_a_kill_hook_kills_its_process_from_engines_json_once(hook, tmp_path):
    """kill_engine_at kills engine 0's server, kill_router_at the launched router (not an external one), each by
    its pid in engines.json, once, as its phase begins (a rollout phase: once the loop asks for that rollout, after
    the step's check for dead engines); nothing else."""
    victim, bystander = _sleeper(), _sleeper()
    try:
        if hook == "kill_engine_at":
            listed = {"engines": [{"pid": victim.pid}, {"pid": bystander.pid}], "routers": []}
        else:
            routers = [
                {"url": "http://127.0.0.1:1", "pid": victim.pid},
                {"url": "http://127.0.0.1:2", "external": True},
            ]
            listed = {"engines": [{"pid": bystander.pid}], "routers": routers}
        (tmp_path / "engines.json").write_text(json.dumps(listed))
        state, _ = _injector(f"debug.{hook}=rollout:1", run_dir=tmp_path)
        state.enter("rollout", 0)
        state.events.publish(RunEvent.ROLLOUT_STARTED, 0)
        state.enter("rollout", 1)
        assert victim.poll() is None  # the step's restart check runs between
        state.events.publish(RunEvent.ROLLOUT_STARTED, 1)
        assert victim.wait(timeout=10) == -signal.SIGKILL and bystander.poll() is None
        state.events.publish(RunEvent.ROLLOUT_STARTED, 1)  # once
    finally:
        victim.kill()
        bystander.kill()


def test_kill_engine_at_a_weight_sync_waits_for_the_push_to_begin_moving_weights(tmp_path):
    """In a weight_sync phase the kill lands once the push found its engines alive (after its restart check), so
    the push itself meets the dead engine."""
    server = _sleeper()
    try:
        (tmp_path / "engines.json").write_text(json.dumps({"engines": [{"pid": server.pid}]}))
        state, _ = _injector("debug.kill_engine_at=weight_sync:0", run_dir=tmp_path)
        state.enter("weight_sync", 0)
        state.events.publish(RunEvent.PUSH_TRANSFER_STARTED, -1)  # the initial push: rollout -1
        assert server.poll() is None
        state.events.publish(RunEvent.PUSH_TRANSFER_STARTED, 0)
        assert server.wait(timeout=10) == -signal.SIGKILL
    finally:
        server.kill()


# ---- fault tolerance: a call a death cut short runs again ----------------------------------------------------


class _DyingWorld(FakeWorld):
    """The fake world whose rollout `die_at` (or eval, "eval") fails once, as the manager fails a call that a router's
    or an engine's death cut short; the restarts the loop asks for are recorded."""

    def __init__(self, die_at, died):
        super().__init__()
        self.die_at, self.died, self.recovered = die_at, died, []
        self.generate = Remote(self._generate_or_die)
        self.evaluate = Remote(self._evaluate_or_die)

    def _fail_once(self, what):
        if self.die_at == what:
            self.die_at = None
            self.events.append(f"died in {what}")
            raise ray.exceptions.RayTaskError("generate", "Traceback: ...", self.died)

    def _generate_or_die(self, rollout_id):
        self._fail_once(rollout_id)
        return self._generate(rollout_id)

    def _evaluate_or_die(self, eval_step):
        self.events.append(f"evaluate {eval_step}")
        self._fail_once("eval")
        return {"eval/score": 1.0}

    def recover(self, weight_version):
        self.recovered.append(weight_version)
        return 1


def _dying_run(monkeypatch, die_at, died, *overrides) -> _DyingWorld:
    eager_ray(monkeypatch)
    world = _DyingWorld(die_at, died)
    cfg = typed_config(["train.num_rollout=2", "eval.interval=1", *overrides])
    parts = RunParts(cfg=cfg, state=RunState(), manager=world, tracker=world, actor=world, pusher=world)
    RunLoop(parts, 0).run()
    return world


FT_ON = "rollout.fault_tolerance.enabled=true"


@pytest.mark.parametrize("died", [EngineDied("engine 0 died", True), RouterDied("the router died", True)])
def test_a_rollout_or_eval_cut_short_by_a_death_runs_again_after_the_restart(monkeypatch, died):
    world = _dying_run(monkeypatch, 1, died, FT_ON)
    at = world.events.index("died in 1")
    assert world.events[at - 1 : at + 3] == ["evaluate 1", "died in 1", "generate 1", "train 1"]
    assert world.recovered == [0, 1, 1]  # before each rollout, and after the death with the weights of 1 step
    world = _dying_run(monkeypatch, "eval", died, FT_ON)
    assert world.events[:4] == ["push 0", "evaluate 0", "died in eval", "evaluate 0"]
    assert world.recovered == [0, 0, 1]  # after the death (the initial weights), then before each rollout


@pytest.mark.parametrize(
    ("died", "overrides"),
    [
        (EngineDied("engine 0 died", True), []),  # fault tolerance off
        (EngineDied("engine 0 died", False), [FT_ON]),  # the data source could not be put back
        (RuntimeError("a reward bug"), [FT_ON]),  # not a death
    ],
)
def test_a_call_that_cannot_run_again_fails_the_run(monkeypatch, died, overrides):
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        _dying_run(monkeypatch, 1, died, *overrides)
    assert info.value.cause is died
