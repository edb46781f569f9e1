"""The run over Ray actors: start-up, the loop (slime.driver.loop), teardown."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from slime.assets.prepare import prepare_assets
from slime.config.async_mode import PauseMode
from slime.config.schema import RunConfig
from slime.driver.console import RunConsole
from slime.driver.interrupts import Interrupts
from slime.driver.loop import RunLoop, RunParts
from slime.driver.placement import RunPlacement, create_placement
from slime.driver.preflight import check_prepared
from slime.driver.ray_session import ray_session
from slime.driver.rollout_setup import lora_serving, rollout_setup
from slime.driver.run_state import RunState
from slime.driver.train_group import TrainGroup
from slime.driver.watchdog import PhaseLimits
from slime.driver.weight_push import WeightPush
from slime.plan.run_plan import RunPlan
from slime.rollout.manager.actor import ACTOR_OPTIONS, RolloutManager
from slime.rollout.manager.stack_dump import STACKS_ENV
from slime.rollout.manager.worker_logging import LEVEL_ENV
from slime.sync.base import SyncContext, SyncedAdapter
from slime.tracking.naming import RunIdentity
from slime.tracking.tracker import Tracker
from slime.train.train_setup import TrainSetup

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunJob:
    """What the driver runs: the resolved (read-only) config, its plan (slime.plan.resolve), what the tracker
    names the run by, and the console the workers' output goes to."""

    cfg: RunConfig
    plan: RunPlan
    config_dict: dict[str, Any]  # the redacted resolved config (plus the env report), for the tracker
    identity: RunIdentity
    console: RunConsole


def run(job: RunJob, state: RunState, interrupts: Interrupts) -> None:
    """Run the whole job; `state` is updated as it goes so a failure can say where it happened."""
    cfg = job.cfg
    state.enter("prepare")
    prepare_assets(cfg)  # here, not in slime.driver.launch: torch and transformers only once a run starts
    check_prepared(cfg)  # ConfigError: nothing started yet
    state.enter("startup")
    # with a watchdog, every actor arms its stack dump (slime.rollout.manager.stack_dump) in this directory
    watched = PhaseLimits.of_config(cfg.runtime).armed
    env = {STACKS_ENV: str(Path(cfg.paths.output_dir) / "stacks")} if watched else {}
    with ray_session(
        cfg.cluster,
        num_bundles=job.plan.roles.num_bundles,
        log_to_driver=cfg.debug.ray_log_to_driver,
        env={**env, **job.console.worker_env, LEVEL_ENV: cfg.debug.log_level},
        worker_output=job.console.worker_output,
    ):
        interrupts.reinstall()  # ray.init replaced the SIGTERM handler
        started = StartedRun(job, state)
        exit_code = 1
        try:
            started.build_loop().run()
            exit_code = 0
        finally:
            interrupts.begin_teardown()
            started.teardown(exit_code=exit_code)


class StartedRun:
    """What a run started on Ray (rollout manager, engines, trainers, tracker), and its teardown."""

    def __init__(self, job: RunJob, state: RunState):
        self.job, self.state = job, state
        self.placement = create_placement(job.plan.roles, device=job.cfg.cluster.device)
        self.placement.check_reachable(job.cfg.cluster.host)
        # on the driver's node: the router it launches is where placement.check_reachable expects it
        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        self.manager = (
            ray.remote(**ACTOR_OPTIONS)(RolloutManager)
            .options(scheduling_strategy=here)
            .remote(rollout_setup(job.cfg, job.plan), self.placement.rollout)
        )
        self.engines_ready = self.tracker = self.loop = None
        self.groups: list[TrainGroup] = []

    def build_loop(self) -> RunLoop:
        """Start-up overlaps: the engines come up while the trainers build, and wandb starts meanwhile."""
        cfg, plan = self.job.cfg, self.job.plan
        derived, layout = plan.derived, plan.layout
        self.engines_ready = self.manager.start.remote()
        if cfg.debug.rollout_only:  # no trainer: engines generate, rewards and metrics logged
            self.tracker = _tracker(self.job)
            ray.get(self.engines_ready)
            parts = RunParts(
                cfg=cfg,
                state=self.state,
                manager=self.manager,
                tracker=self.tracker,
                group_poll_s=self.job.console.group_poll_s,
            )
            self.loop = RunLoop(parts, 0)
            return self.loop
        actor = TrainGroup.launch(TrainSetup.from_run_config(cfg, derived), self.placement.actor, layout)
        self.groups.append(actor)
        critic = None
        if plan.critic:
            critic = TrainGroup.launch(
                TrainSetup.for_critic(cfg, derived), self.placement.critic, layout, role="critic"
            )
            self.groups.append(critic)
        pending = [group.begin_init() for group in self.groups]
        self.tracker = _tracker(self.job)
        self.state.start_rollout = start = actor.finish_init(pending[0])
        if critic is not None and critic.finish_init(pending[1]) != start:
            raise RuntimeError(
                "the critic checkpoint is not at the actor's rollout step: set train.critic.load "
                "to the critic saved with checkpoint.load"
            )
        _write_placement(Path(cfg.paths.output_dir), self.placement, actor)  # its ranks are up: asked at once
        ray.get(self.engines_ready)
        pusher = None  # replaying dumps (debug.load_rollout_data) starts no engine to push weights to
        if cfg.debug.load_rollout_data is None:
            pusher = WeightPush(cfg, self.manager, actor, _sync_context(cfg), self.state.events)
            pusher.connect()
        if start > 0:
            ray.get(self.manager.load.remote(start - 1, cfg.checkpoint.load))
        parts = RunParts(
            cfg=cfg,
            state=self.state,
            manager=self.manager,
            tracker=self.tracker,
            actor=actor,
            critic=critic,
            pusher=pusher,
            group_poll_s=self.job.console.group_poll_s,
        )
        self.loop = RunLoop(parts, start)
        return self.loop

    def teardown(self, *, exit_code: int) -> None:
        """Stop the rollout side (killed if still starting), close the tracker meanwhile, then the trainers."""
        state = self.state
        state_phase = state.phase
        state.enter("teardown")
        graceful = state.hung is None  # a hung actor answers no shutdown call: it is killed
        if not graceful or self.engines_ready is None or not ray.wait([self.engines_ready], timeout=0)[0]:
            # Still starting (or hung): a shutdown call would wait for the engines to come up (or the hung call)
            # first. Killing the manager takes its router and engine actors along (their servers die with them).
            ray.kill(self.manager)
            stopping = None
        else:
            stopping = self.manager.shutdown.remote()  # the engines and the router stop while the tracker closes
        if self.tracker is not None:
            if self.loop is not None:
                self.loop.close()
            state.outputs = self.tracker.finish(exit_code)
            state.reward_curve = state.outputs.get("plot:reward_curve")
        try:
            if stopping is not None:
                ray.get(stopping, timeout=60)
        except Exception as exc:  # keep tearing down; ray.shutdown() below kills what is left
            logger.warning("rollout manager shutdown failed: %s", exc)
        for group in self.groups:
            group.shutdown(graceful=graceful)
        state.phase = state_phase if exit_code else "done"


def _write_placement(run_dir: Path, placement: RunPlacement, actor: TrainGroup) -> None:
    """`<run dir>/placement.json`: the reserved node and GPU of every trainer rank and engine, and the node each
    trainer rank's process reports it runs on (`process_node_id`)."""
    record = placement.describe()
    for rank, node_id in enumerate(actor.node_ids()):
        record["actor"][rank]["process_node_id"] = node_id
    (run_dir / "placement.json").write_text(json.dumps(record, indent=2) + "\n")


def _tracker(job: RunJob) -> Tracker:
    cfg = job.cfg
    return Tracker(
        cfg.logger,
        run_dir=Path(cfg.paths.output_dir),
        config=job.config_dict,
        identity=job.identity,
        steps_per_rollout=cfg.train.num_steps_per_rollout,
    )


def _sync_context(cfg: RunConfig) -> SyncContext:
    w, serving = cfg.rollout.weight_sync, lora_serving(cfg.model.lora)
    return SyncContext(
        source_checkpoint=cfg.model.hf_checkpoint,
        engine=cfg.rollout.engine,
        work_dir=str(Path(cfg.paths.output_dir)),
        bucket_bytes=w.bucket_mb << 20,
        keep=w.keep,
        check_weight_update_equal=cfg.debug.check_weight_update_equal,
        verify=w.verify,
        # a push that must be made again on a mismatch (resync) is checked inside it; a failing one may stop the run
        # later, before what the engines generate on it trains (slime.driver.weight_push)
        defer_verify=w.verify and w.on_mismatch != "resync",
        delta_full_every=w.full_every if w.delta else 0,
        corrupt_version=cfg.debug.corrupt_push_version,
        pause_mode=PauseMode.resolve(w.pause_mode, cfg.train.async_mode),
        adapter=SyncedAdapter(name=serving.adapter_name, config=cfg.model.lora.adapter_config()) if serving else None,
    )
