"""Getting new weights into the engines: the colocated memory hand-off and restarted engines.

Colocated (`cluster.colocate=true`, REFERENCE.md §2.3), in this exact order:

    push:         train offload -> engines resume "weights" -> weight sync -> engines resume "kv_cache", "cuda_graph"
    before train: engines flush + release every tag -> train onload

Disaggregated, a push is the weight sync alone (it pauses, flushes and continues generation itself).
Every step of the hand-off is appended to `<run dir>/handoff.jsonl` (`{"rollout_id", "step"}`) as it
starts, so a test (or an operator) can check the order; on GPU the same calls free and retake memory.

With fault tolerance, `recover()` runs before each rollout: engines the health checks found dead are
restarted, the weight sync is reconnected (the distributed group is rebuilt for the new URLs), the
current weights are pushed, and only then do the restarted engines rejoin their router.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import ray

from slime.config.schema import RunConfig
from slime.runtime.train_group import TrainGroup
from slime.sync.base import SyncContext

logger = logging.getLogger(__name__)

HANDOFF_FILE = "handoff.jsonl"
RESUME_WEIGHTS = ["weights"]
RESUME_REST = ["kv_cache", "cuda_graph"]


class WeightPush:
    """The driver's side of weight pushes; see the module docstring."""

    def __init__(self, cfg: RunConfig, manager, actor: TrainGroup, context: SyncContext, run_dir: Path):
        self.cfg = cfg
        self.manager = manager
        self.actor = actor
        self.context = context
        self.colocate = cfg.cluster.colocate
        self.log_path = run_dir / HANDOFF_FILE

    def connect(self) -> None:
        """(Re)build the weight-sync object on the trainer for the engines' current URLs."""
        mode = self.cfg.rollout.weight_sync.mode
        urls = ray.get(self.manager.urls.remote())
        context = self.context
        if mode == "tensor":  # engine TP rank i opens the handle of the training rank on its device
            context = dataclasses.replace(context, tp_trainer_ranks=ray.get(self.manager.tensor_handle_ranks.remote()))
        self.actor.connect_weight_sync(mode, urls, context)

    def _step(self, rollout_id: int, step: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(json.dumps({"rollout_id": rollout_id, "step": step}) + "\n")

    def _control(self, call: str, *args) -> None:
        ray.get(self.manager.engine_control.remote(call, *args))

    def push(self, weight_version: int) -> dict[str, float]:
        """Push the trainer's weights as `weight_version`; returns the sync's `perf/*` metrics."""
        rollout_id = weight_version - 1
        if not self.colocate:
            return self.actor.update_weights(weight_version=weight_version)
        self._step(rollout_id, "train_offload")
        self.actor.offload()
        self._step(rollout_id, "engine_resume_weights")
        self._control("resume_memory", RESUME_WEIGHTS)
        self._step(rollout_id, "weight_sync")
        metrics = self.actor.update_weights(weight_version=weight_version)
        self._step(rollout_id, "engine_resume_kv_cache")
        self._control("resume_memory", RESUME_REST)
        return metrics

    def before_train(self, rollout_id: int) -> None:
        """Colocated: the engines give their memory back, then the trainer takes its own back."""
        if not self.colocate:
            return
        self._step(rollout_id, "engine_release")
        self._control("release_memory")
        self._step(rollout_id, "train_onload")
        self.actor.onload()

    def sync(self, weight_version: int) -> dict[str, float]:
        """The loop's push: with fault tolerance, dead engines are restarted first and pushed to with the
        others, then rejoin their routers; `rollout/engine_restarts` counts them."""
        ranks = self._restart_dead()
        metrics = self.push(weight_version)
        if ranks:
            ray.get(self.manager.register_engines.remote(ranks))
        return {**metrics, "rollout/engine_restarts": float(len(ranks))}

    def recover(self, weight_version: int) -> int:
        """Before a rollout: restart engines that died since the last push, sync them with the current
        weights (`weight_version`), put them back behind their routers; returns how many restarted."""
        ranks = self._restart_dead()
        if ranks:
            self.push(weight_version)
            ray.get(self.manager.register_engines.remote(ranks))
        return len(ranks)

    def _restart_dead(self) -> list[int]:
        if not self.cfg.rollout.fault_tolerance.enabled:
            return []
        ranks = ray.get(self.manager.recover_engines.remote())
        if ranks:
            logger.warning("engines %s restarted: they get the trainer's weights before they rejoin", ranks)
            self.connect()  # new URLs (and a new broadcast group for distributed syncs)
        return ranks
