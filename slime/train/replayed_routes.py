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
from slime.types import TrainBatch


class ReplayedRoutes:
    """A backend mixin over `TrainBackend`: `self.setup`, `self.batch`."""

    @property
    def routing_replay(self) -> RoutingReplay:
        return RoutingReplay(self.setup.algo.routing_replay)

    def load_batch(self, rollout_id: int, batch: TrainBatch) -> None:
        super().load_batch(rollout_id, batch)
        self.recorded_routes: dict[tuple[int, ...], Any] = {}  # micro-batch -> its recorded routes (train mode)
        self.sample_routes = self._engine_routes(batch) if self.routing_replay.engine_returns_routes else None

    def _engine_routes(self, batch: TrainBatch) -> list[np.ndarray]:
        """Per sample int32 `[len(tokens) - 1, num_layers, topk]` from the engine's base64."""
        if batch.routed_experts is None or any(r is None for r in batch.routed_experts):
            raise ValueError(
                "algo.routing_replay=rollout needs the engine's routes on every sample, and the rollout returned "
                "none (a custom generate function must keep meta_info.routed_experts: "
                "slime.rollout.generate.append_engine_output)"
            )
        m = self.setup.model
        return [
            decode_routes(text, num_tokens=len(tokens), num_layers=m.num_layers, topk=m.moe_router_topk)
            for text, tokens in zip(batch.routed_experts, batch.tokens)
        ]

    def _records_routes(self, frozen) -> bool:
        """Whether a log-prob pass with `frozen` (None: the policy's own) records the policy's routes (train mode)."""
        return frozen is None and self.routing_replay.trainer_records_routes

    def _recorded(self, mb: list[int]):
        """The routes the log-prob pass recorded for micro-batch `mb` (train mode)."""
        key = tuple(mb)
        if key not in self.recorded_routes:
            raise RuntimeError(
                f"routing replay (train): micro-batch {list(mb)} was not in the log-prob pass; the passes must "
                "split the batch alike"
            )
        return self.recorded_routes[key]
