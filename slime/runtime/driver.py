"""The run over Ray actors: start-up, the training loop, teardown.

The synchronous loop (REFERENCE.md §2.2):

    initial weight push -> [eval at 0] -> for each rollout id:
        rollout + rewards -> train (log-probs, advantages, K optimizer steps) -> save if due
        -> weight sync -> eval if due -> log

`train.async=true` runs the one-step-async loop instead (async_loop.py); steps.py holds what both share.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from slime.config.derive import Derived
from slime.config.schema import RunConfig
from slime.engine.groups import engine_specs
from slime.runtime.async_loop import run_async_loop
from slime.runtime.debug_modes import rollout_only
from slime.runtime.interrupts import Interrupts, kill_descendants
from slime.runtime.placement import create_placement
from slime.runtime.ray_session import ray_session
from slime.runtime.rollout_manager import ACTOR_OPTIONS, RolloutManager
from slime.runtime.rollout_setup import RolloutSetup
from slime.runtime.rollout_watch import generate_watched
from slime.runtime.steps import begin_loop, finish_rollout, save_if_due, sync_weights, timed_train_step
from slime.runtime.train_group import TrainGroup
from slime.runtime.watchdog import STACKS_ENV
from slime.runtime.weight_push import WeightPush
from slime.sync.base import SyncContext
from slime.tracking.naming import RunIdentity
from slime.tracking.tracker import Tracker
from slime.train.layout import RankLayout
from slime.train.setup import TrainSetup

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RunState:
    """What result.json reports: the phase reached, progress and the last metrics.

    Every phase change is logged with the time the phase took (the heartbeat); the watchdog
    (slime.runtime.watchdog) reads `phase`, `phase_rollout` and `phase_started` from its own thread.

    `signal_at` (from `debug.signal_at`/`debug.signal`) is fault injection for tests of the signal
    path: on entering that phase (of that rollout id, when given) a thread sends the signal to this
    process, so it arrives while the phase is under way, as a user's Ctrl-C would (SIGKILL: the whole
    run dies at once, as in a crash). `hang_at`
    (`debug.hang_at`) calls `hang` on entering its phase (a save: mid-way, its data-source state written and
    the trainer's not): the driver waits on a rank that never answers.
    """

    phase: str = "config"
    phase_rollout: int | None = None
    phase_started: float = dataclasses.field(default_factory=time.monotonic)
    rollouts_completed: int = 0
    start_rollout: int = 0
    last_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    last_eval: dict[str, float] = dataclasses.field(default_factory=dict)  # the last eval's metrics
    reward_curve: str | None = None
    outputs: dict[str, str] = dataclasses.field(default_factory=dict)  # what the tracker wrote (name -> path)
    signal_at: tuple[str, int | None, int, float] | None = None  # (phase, rollout id | None, signal, delay s)
    hang_at: tuple[str, int | None] | None = None  # (phase, rollout id | None)
    hang: Callable[[], None] | None = None
    hung: str | None = None  # the watchdog's message once a phase overran runtime.phase_timeout_s
    tearing_down: bool = False  # from here on the watchdog rests (teardown bounds its own waits)
    on_enter: Callable[[str, int | None], None] | None = None  # the progress display follows the phases

    def enter(self, phase: str, rollout_id: int | None = None) -> None:
        now = time.monotonic()
        if self.phase != "config":
            logger.info("%s done in %.2fs", _phase_name(self.phase, self.phase_rollout), now - self.phase_started)
        logger.info("%s started", _phase_name(phase, rollout_id))
        self.phase, self.phase_rollout, self.phase_started = phase, rollout_id, now
        if self.on_enter is not None:
            self.on_enter(phase, rollout_id)
        if self.signal_at is not None and _matches(self.signal_at[:2], phase, rollout_id):
            signum, delay_s = self.signal_at[2:]
            self.signal_at = None
            timer = threading.Timer(delay_s, _send_signal, args=(signum,))
            timer.daemon = True
            timer.start()
        if (
            phase != "save"
        ):  # after the signal's timer: a hang there meets the signal; a save hangs mid-way (steps.save_checkpoint)
            self.fault_point(phase, rollout_id)

    def fault_point(self, phase: str, rollout_id: int | None) -> None:
        """Hang here if `debug.hang_at` names this phase (and rollout id)."""
        if _matches(self.hang_at, phase, rollout_id) and self.hang is not None:
            self.hang_at = None
            self.hang()


def _send_signal(signum: int) -> None:
    """debug.signal_at's signal to this process; SIGKILL kills every process of the run first (a crash)."""
    if signum == signal.SIGKILL:
        kill_descendants()
    os.kill(os.getpid(), signum)


def _matches(target: tuple[str, int | None] | None, phase: str, rollout_id: int | None) -> bool:
    return target is not None and phase == target[0] and (target[1] is None or target[1] == rollout_id)


def _phase_name(phase: str, rollout_id: int | None) -> str:
    return f"phase {phase}" + (f" (rollout {rollout_id})" if rollout_id is not None else "")


def run(
    cfg: RunConfig,
    derived: Derived,
    state: RunState,
    interrupts: Interrupts,
    *,
    config_dict: dict[str, Any],
    identity: RunIdentity,
) -> None:
    """Run the whole job; `state` is updated as it goes so a failure can say where it happened."""
    run_dir = Path(cfg.paths.output_dir)
    state.enter("startup")
    # with a watchdog, every actor arms its stack dump (slime.runtime.watchdog) in this directory
    env = {STACKS_ENV: str(run_dir / "stacks")} if cfg.runtime.phase_timeout_s else {}
    with ray_session(cfg.cluster, num_bundles=derived.total_gpus, log_to_driver=cfg.debug.ray_log_to_driver, env=env):
        interrupts.reinstall()  # ray.init replaced the SIGTERM handler
        ppo = cfg.algo.advantage_estimator == "ppo"
        placement = create_placement(
            derived,
            device=cfg.cluster.device,
            colocate=cfg.cluster.colocate,
            engine_gpus=[spec.num_gpus for spec in engine_specs(cfg, derived.rollout_gpus)],
            critic_with_actor=ppo and cfg.cluster.critic.colocate_with_actor,
        )
        manager = ray.remote(**ACTOR_OPTIONS)(RolloutManager).remote(
            RolloutSetup.from_run_config(cfg, derived), placement.rollout
        )
        actor = critic = tracker = engines_ready = None
        exit_code = 1
        try:
            # Startup overlaps: the engines come up while the trainers build, and wandb starts meanwhile.
            engines_ready = manager.start.remote()
            if cfg.debug.rollout_only:  # no trainer: engines generate, rewards and metrics logged
                tracker = _tracker(cfg, run_dir, config_dict, identity)
                rollout_only(cfg, state, manager, engines_ready, tracker)
                exit_code = 0
                return
            layout = train_layout(cfg, derived)
            actor = TrainGroup(TrainSetup.from_run_config(cfg, derived), placement.actor, layout)
            critic = (
                TrainGroup(TrainSetup.for_critic(cfg, derived), placement.critic, layout, role="critic")
                if ppo
                else None
            )
            actor_init, critic_init = actor.begin_init(), critic.begin_init() if critic is not None else None
            tracker = _tracker(cfg, run_dir, config_dict, identity)
            state.on_enter = tracker.progress.on_phase
            state.hang = actor.hang
            state.start_rollout = start = actor.finish_init(actor_init)
            if critic is not None and critic.finish_init(critic_init) != start:
                raise RuntimeError(
                    "the critic checkpoint is not at the actor's rollout step: set train.critic.load "
                    "to the critic saved with checkpoint.load"
                )
            tracker.progress.begin(start)
            ray.get(engines_ready)
            pusher = None  # replaying dumps (debug.load_rollout_data) starts no engine to push weights to
            if cfg.debug.load_rollout_data is None:
                pusher = WeightPush(cfg, manager, actor, _sync_context(cfg, run_dir), run_dir)
                pusher.connect()
            if start > 0:
                ray.get(manager.load.remote(start - 1, cfg.checkpoint.load))
            loop = run_async_loop if cfg.train.is_async else _loop
            loop(cfg, state, start, manager, actor, critic, tracker, pusher)
            exit_code = 0
        finally:
            interrupts.begin_teardown()
            _teardown(state, manager, engines_ready, tracker, (actor, critic), exit_code=exit_code)


def _tracker(cfg: RunConfig, run_dir: Path, config_dict: dict[str, Any], identity: RunIdentity) -> Tracker:
    return Tracker(
        cfg.logger,
        run_dir=run_dir,
        config=config_dict,
        identity=identity,
        total_rollouts=cfg.train.num_rollout,
        steps_per_rollout=cfg.train.num_steps_per_rollout,
    )


def _teardown(state: RunState, manager, engines_ready, tracker: Tracker | None, groups, *, exit_code: int) -> None:
    """Stop the rollout side (killed if still starting), close the tracker meanwhile, then the trainers."""
    state_phase = state.phase
    state.tearing_down = True
    state.enter("teardown")
    graceful = state.hung is None  # a hung actor answers no shutdown call: it is killed
    if not graceful or engines_ready is None or not ray.wait([engines_ready], timeout=0)[0]:
        # Still starting (or hung): a shutdown call would wait for the engines to come up (or the hung call)
        # first. Killing the manager takes its router and engine actors along (their servers die with them).
        ray.kill(manager)
        stopping = None
    else:
        stopping = manager.shutdown.remote()  # the engines and the router stop while the tracker closes
    if tracker is not None:
        state.on_enter = None
        state.outputs = tracker.finish(exit_code)
        state.reward_curve = state.outputs.get("plot:reward_curve")
    try:
        if stopping is not None:
            ray.get(stopping, timeout=60)
    except Exception as exc:  # keep tearing down; ray.shutdown() below kills what is left
        logger.warning("rollout manager shutdown failed: %s", exc)
    for group in groups:
        if group is not None:
            group.shutdown(graceful=graceful)
    state.phase = state_phase if exit_code else "done"


def train_layout(cfg: RunConfig, derived: Derived) -> RankLayout:
    """The training group's rank layout (the critic mirrors the actor's)."""
    p = cfg.parallelism
    return RankLayout.for_world(derived.actor_gpus, tp=p.tp, cp=p.cp, pp=p.pp, ep=p.ep, etp=p.etp)


def _sync_context(cfg: RunConfig, run_dir: Path) -> SyncContext:
    w = cfg.rollout.weight_sync
    return SyncContext(
        source_checkpoint=cfg.model.hf_checkpoint,
        engine=cfg.rollout.engine,
        work_dir=str(run_dir),
        bucket_bytes=w.bucket_mb << 20,
        keep=w.keep,
        check_weight_update_equal=cfg.debug.check_weight_update_equal,
    )


def _loop(
    cfg: RunConfig,
    state: RunState,
    start: int,
    manager,
    actor: TrainGroup,
    critic: TrainGroup | None,
    tracker: Tracker,
    pusher: WeightPush | None,
) -> None:
    """REFERENCE.md §2.2: initial push, eval at 0, then per rollout id: rollout, train, save, sync, eval."""
    clock = begin_loop(cfg, state, start, manager, tracker, pusher)
    for rollout_id in range(start, cfg.train.num_rollout):
        step_start = time.perf_counter()
        state.enter("rollout", rollout_id)
        restarted = pusher.recover(weight_version=rollout_id) if pusher is not None else 0
        progress = tracker.progress
        batches, metrics, preview = generate_watched(manager, rollout_id, progress.rollout_groups, progress.poll_s)
        clock.rebase(metrics)
        state.enter("log_probs", rollout_id)
        if pusher is not None:
            pusher.before_train(rollout_id)
        steps = timed_train_step(cfg, rollout_id, batches, actor, critic, metrics, state=state, clock=clock)
        save_if_due(cfg, state, rollout_id, manager, actor, critic, tracker, metrics, steps)
        state.enter("weight_sync", rollout_id)
        sync_weights(pusher, rollout_id, metrics, restarted)
        metrics["perf/step_time"] = time.perf_counter() - step_start
        finish_rollout(cfg, state, rollout_id, manager, tracker, metrics, steps, preview)
