"""`train.async`: which training loop overlaps generation with training (docs/training-loops.md).

- off: the synchronous loop (docs/architecture.md#synchronous-loop): rollout k, then train k, then push.
- one_step: rollout k+1 is generated while step k trains (docs/architecture.md#one-step-asynchronous-loop); a
  push waits for that rollout.
- full: the engines generate continuously; the trainer takes each step's groups from a bounded buffer as they
  finish, and pushes interrupt generation (pause, push, continue); `train.max_staleness` bounds how many weight
  versions old a trained group's oldest token may be (AReaL's, miles' and verl's fully-async trainers).

The bools of earlier configs keep their meaning: false is off, true is one_step.
"""

from __future__ import annotations

import enum
from typing import Any


class AsyncMode(str, enum.Enum):
    OFF = "off"
    ONE_STEP = "one_step"
    FULL = "full"

    @classmethod
    def parse(cls, value: Any) -> AsyncMode:
        """The mode a `train.async` value names (false/true: off/one_step); ValueError for anything else."""
        if isinstance(value, bool):
            return cls.ONE_STEP if value else cls.OFF
        for mode in cls:
            if value == mode.value:
                return mode
        raise ValueError(f"train.async must be one of {[m.value for m in cls]} (or false/true), got {value!r}")


class StalePolicy(str, enum.Enum):
    """rollout.stale_policy: what a group older than train.max_staleness gets (train.async=full)."""

    DROP = "drop"  # not trained, counted (rollout/stale_dropped_groups)
    REGENERATE = "regenerate"  # its prompt goes back to the data source, generated again with newer weights


class PauseMode(str, enum.Enum):
    """rollout.weight_sync.pause_mode: what a weight push does to the requests the engines are running."""

    ABORT = "abort"  # they end, returning their partial output; the rollout sends each again on the new weights
    # they stay where they are and decode on after the push, on the new weights with the KV cache the old ones
    # built (SGLang's "in_place", vLLM's "keep", the built-in engine's); each token reports its version
    IN_PLACE = "in_place"

    @classmethod
    def resolve(cls, value: Any, mode: AsyncMode) -> PauseMode:
        """The mode a `pause_mode` value names; null: in_place under train.async=full (requests keep running across
        every push), abort otherwise (a push finds the engines idle). ValueError for anything else."""
        if value is None:
            return cls.IN_PLACE if mode is AsyncMode.FULL else cls.ABORT
        for pause in cls:
            if value == pause.value:
                return pause
        raise ValueError(f"must be one of {[p.value for p in cls]} or null, got {value!r}")
