"""Getting new weights into the engines: the colocated memory hand-off and restarted engines.

Colocated (`cluster.colocate=true`, docs/architecture.md#colocated-hand-off), in this exact order:

    push:         train offload -> engines resume "weights" -> weight sync -> engines resume "kv_cache", "cuda_graph"
    before train: engines flush + release every tag -> train onload

Disaggregated, a push is the weight sync alone (it pauses, flushes and continues generation itself).
Every step of the hand-off is logged as it starts ("hand-off step STEP (rollout ID)", HANDOFF_LOG), so the run's
log shows the order; on GPU the same calls free and retake memory.

Every push is bracketed by the rollout manager's `begin_push` / `end_push`: the engines' health checks rest
from its first step to its last (a paused SGLang engine does not answer /health; engine_health.py).

With fault tolerance, dead engines are restarted inside the push, after the trainer went off the GPUs
(colocated), and come up with their memory released, as slime's recovery does: the push then resumes their
weights with everyone's (hand-off step `engine_restart`). The weight sync is reconnected (the distributed
group is rebuilt for the new URLs), the weights are pushed, and only then do the restarted engines rejoin
their router. `sync()` is the loop's push; `recover()` runs before each rollout and pushes only when an
engine died since.

An engine that dies during a push (its server gone when the push reaches it, or in the middle of a transfer) fails
the push naming it (`EngineDied`: rank, URL, pid, log), never only with the connection error. With fault tolerance
the dead engine is restarted and the whole push made again to every engine, as often as `max_restarts` allows: the
others may hold half of the new weights, and every mode's push is whole or repeated (a distributed sync rebuilds its
group for the new URL).
"""

from __future__ import annotations

import dataclasses
import logging

import ray

from slime.config.schema import RunConfig
from slime.registry import WEIGHT_SYNC
from slime.runtime.deaths import EngineDied, failure_text
from slime.runtime.events import EventBus, RunEvent
from slime.runtime.train_group import TrainGroup
from slime.sync.base import SyncContext

logger = logging.getLogger(__name__)

HANDOFF_LOG = "hand-off step %s (rollout %d)"
RESUME_WEIGHTS = ["weights"]
RESUME_REST = ["kv_cache", "cuda_graph"]


class WeightPush:
    """The driver's side of weight pushes; see the module docstring."""

    def __init__(self, cfg: RunConfig, manager, actor: TrainGroup, context: SyncContext, events: EventBus):
        self.cfg = cfg
        self.events = events
        self.manager = manager
        self.actor = actor
        self.context = context
        self.colocate = cfg.cluster.colocate
        self.fault_tolerance = cfg.rollout.fault_tolerance.enabled
        self.trainer_on_device = True  # colocated: the trainer builds on the GPUs; each push offloads it

    def connect(self) -> None:
        """(Re)build the weight-sync object on the trainer for the engines' current URLs."""
        mode = self.cfg.rollout.weight_sync.mode
        urls = ray.get(self.manager.urls.remote())
        context = self.context
        if WEIGHT_SYNC.facts(mode).needs_tensor_handle_ranks:
            context = dataclasses.replace(context, tp_trainer_ranks=ray.get(self.manager.tensor_handle_ranks.remote()))
        self.actor.connect_weight_sync(mode, urls, context)

    def _step(self, rollout_id: int, step: str) -> None:
        logger.info(HANDOFF_LOG, step, rollout_id)

    def _control(self, call: str, *args) -> None:
        ray.get(self.manager.engine_control.remote(call, *args))

    def push(self, weight_version: int) -> dict[str, float]:
        """Push the trainer's weights as `weight_version`; returns the sync's `perf/*` metrics."""
        return self._push(weight_version, restart=False)[0]

    def sync(self, weight_version: int) -> dict[str, float]:
        """The loop's push: with fault tolerance, dead engines are restarted first and pushed to with the
        others, then rejoin their routers; `rollout/engine_restarts` counts them."""
        metrics, ranks = self._push(weight_version, restart=self.fault_tolerance)
        return {**metrics, "rollout/engine_restarts": float(len(ranks))}

    def recover(self, weight_version: int) -> int:
        """Before a rollout: restart engines that died since the last push, sync them with the current
        weights (`weight_version`), put them back behind their routers; returns how many restarted."""
        if not self.fault_tolerance or not ray.get(self.manager.dead_engines.remote()):
            return 0
        return len(self._push(weight_version, restart=True)[1])

    def _push(self, weight_version: int, *, restart: bool) -> tuple[dict[str, float], list[int]]:
        """One push, made again once dead engines restarted where an engine's death failed it (the module
        docstring): (the sync's metrics, the ranks restarted by every attempt)."""
        ft = self.cfg.rollout.fault_tolerance
        attempts = ft.max_restarts + 1 if self.fault_tolerance else 1
        restarted: list[int] = []  # kept across attempts: each rejoins its router once a push succeeded
        for attempt in range(attempts):
            try:
                return self._push_once(weight_version, restart=restart or attempt > 0, restarted=restarted), restarted
            except Exception as exc:  # noqa: BLE001 - re-raised unless an engine's death explains it
                deaths = self._engine_deaths()
                if not deaths:
                    raise
                failed = f"the weight push of version {weight_version} failed: {'; '.join(deaths)}"
                failed += f" ({failure_text(exc).splitlines()[0]})"
                if attempt + 1 == attempts:
                    raise EngineDied(failed) from exc
                logger.warning("%s; pushing again to every engine once the engine restarted", failed)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _engine_deaths(self) -> list[str]:
        """What the rollout manager says of dead engines after a failed push ([] when it cannot say)."""
        try:
            return ray.get(self.manager.engine_deaths.remote())
        except Exception as exc:  # noqa: BLE001 - the push's own error is the one to report
            logger.warning("asking the rollout manager for dead engines after a failed push failed: %s", exc)
            return []

    def _push_once(self, weight_version: int, *, restart: bool, restarted: list[int]) -> dict[str, float]:
        """One push, the engines' health checks resting throughout; dead engines it restarts are added to
        `restarted`, and all of those rejoin their routers once the weights are in. Returns the sync's metrics."""
        rollout_id = weight_version - 1
        self._control("begin_push")
        try:
            if self.colocate and self.trainer_on_device:
                self._step(rollout_id, "train_offload")
                self.actor.offload()
                self.trainer_on_device = False
            if restart:
                restarted += self._restart_dead(rollout_id)
            self.events.publish(RunEvent.PUSH_TRANSFER_STARTED, rollout_id)
            if self.colocate:
                self._step(rollout_id, "engine_resume_weights")
                self._control("resume_memory", RESUME_WEIGHTS)
                self._step(rollout_id, "weight_sync")
            metrics = self.actor.update_weights(weight_version=weight_version)
            if self.colocate:
                self._step(rollout_id, "engine_resume_kv_cache")
                self._control("resume_memory", RESUME_REST)
            if restarted:
                ray.get(self.manager.register_engines.remote(sorted(set(restarted))))  # one restarted twice: once
        finally:
            self._control("end_push")
        return metrics

    def before_train(self, rollout_id: int) -> None:
        """Colocated: the engines give their memory back, then the trainer takes its own back."""
        if not self.colocate:
            return
        self._step(rollout_id, "engine_release")
        self._control("release_memory")
        self._step(rollout_id, "train_onload")
        self.actor.onload()
        self.trainer_on_device = True

    def _restart_dead(self, rollout_id: int) -> list[int]:
        if not ray.get(self.manager.dead_engines.remote()):
            return []
        if self.colocate:
            self._step(rollout_id, "engine_restart")
        ranks = ray.get(self.manager.recover_engines.remote())
        logger.warning("engines %s restarted: they get the trainer's weights before they rejoin", ranks)
        self.connect()  # new URLs (and a new broadcast group for distributed syncs)
        return ranks
