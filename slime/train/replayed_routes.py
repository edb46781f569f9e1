"""MoE routing replay on a loaded batch (`algo.routing_replay`: slime.config.routing_replay), for every backend.

rollout: each sample's engine routes (`TrainBatch.routed_experts`) are decoded once per batch; the policy's
log-prob and training forwards replay them. train: the policy's log-prob forward (`compute_log_probs("old")`)
records its routes per micro-batch, in the backend's own layout, and the training forwards of the same
micro-batches replay them (as slime's `--use-routing-replay`). Frozen models (reference, teacher) route freely.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from slime.config.routing_replay import RoutingReplay
from slime.models.moe.routes import decode_routes
from slime.train.train_setup import TrainSetup
from slime.types import TrainBatch


class RouteReplay:
    """An actor's routing replay (`algo.routing_replay`) over the batch it has loaded: the engine's routes per
    sample (rollout mode) or the routes its log-prob pass recorded per micro-batch (train mode). The actor
    backends hold one and call `load` with each batch."""

    def __init__(self, setup: TrainSetup):
        self.mode = RoutingReplay(setup.algo.routing_replay)
        self.model = setup.model
        self.recorded: dict[tuple[int, ...], Any] = {}  # micro-batch -> its recorded routes (train mode)
        self.sample_routes: list[np.ndarray] | None = None  # per sample, the engine's (rollout mode)

    @property
    def replays(self) -> bool:
        return self.mode.replays

    def load(self, batch: TrainBatch) -> None:
        """A new batch: no routes recorded yet; the engine's decoded when this mode replays them."""
        self.recorded = {}
        self.sample_routes = self._engine_routes(batch) if self.mode.engine_returns_routes else None

    def _engine_routes(self, batch: TrainBatch) -> list[np.ndarray]:
        """Per sample int32 `[len(tokens) - 1, num_layers, topk]` from the engine's base64."""
        if batch.routed_experts is None or any(r is None for r in batch.routed_experts):
            raise ValueError(
                "algo.routing_replay=rollout needs the engine's routes on every sample, and the rollout returned "
                "none (a custom generate function must keep meta_info.routed_experts: "
                "slime.rollout.generate.append_engine_output)"
            )
        m = self.model
        return [
            decode_routes(text, num_tokens=len(tokens), num_layers=m.num_layers, topk=m.moe_router_topk)
            for text, tokens in zip(batch.routed_experts, batch.tokens)
        ]

    def records(self, frozen) -> bool:
        """Whether a log-prob pass with `frozen` (None: the policy's own) records the policy's routes (train mode)."""
        return frozen is None and self.mode.trainer_records_routes

    def recorded_for(self, mb: list[int]):
        """The routes the log-prob pass recorded for micro-batch `mb` (train mode)."""
        key = tuple(mb)
        if key not in self.recorded:
            raise RuntimeError(
                f"routing replay (train): micro-batch {list(mb)} was not in the log-prob pass; the passes must "
                "split the batch alike"
            )
        return self.recorded[key]
