"""The modes of `algo.routing_replay` (MoE routing replay, slime.models.moe): whose routes a trainer's forwards follow.

none; the engine's (`rollout`, R3, slime's --use-rollout-routing-replay); or the policy's own log-prob forward of
the step (`train`, slime's --use-routing-replay), replayed in its training forwards. A config value like the
others: validation, the engines' launch and the trainers read a mode's properties, never its string.
"""

from __future__ import annotations

import enum


class RoutingReplay(enum.Enum):
    """The values of `algo.routing_replay`."""

    NONE = "none"
    ROLLOUT = "rollout"  # the engine returns its routes with every response; every trainer forward replays them
    TRAIN = "train"  # the policy's log-prob forward records its routes; the training forwards replay them

    @classmethod
    def named(cls, value: str) -> RoutingReplay | None:
        """The mode `algo.routing_replay=value` names; None for an unknown value (validation reports it)."""
        return next((mode for mode in cls if mode.value == value), None)

    @property
    def engine_returns_routes(self) -> bool:
        return self is RoutingReplay.ROLLOUT

    @property
    def trainer_records_routes(self) -> bool:
        return self is RoutingReplay.TRAIN

    @property
    def replays(self) -> bool:
        return self is not RoutingReplay.NONE
