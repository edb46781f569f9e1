"""The run's phase events: what the loop publishes as a rollout step goes by, and who listens.

Both loops (slime.driver.loop) publish the same events in the same places, so everything that follows the run
(the progress display, the watchdog's heartbeat, checkpoint bookkeeping, a fault injector when a debug option
asks for one) subscribes here instead of being called from inside the loop. Handlers run synchronously in the
publishing (main) thread, in the order they subscribed.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any


class RunEvent(enum.Enum):
    """What happened; `Event.rollout_id` says for which rollout step (-1: before the first, None: no step)."""

    LOOP_STARTED = "loop_started"  # the run's parts are up; `data["start"]`: the first rollout, `data["trainer"]`
    PHASE_STARTED = "phase_started"  # the driver entered `data["phase"]` (RUN_PHASES) at `data["started"]`
    ROLLOUT_STARTED = "rollout_started"  # the rollout manager was asked for this rollout
    ROLLOUT_PROGRESS = "rollout_progress"  # `data["counts"]`: the rollout's group counts; `data["final"]`
    ROLLOUT_DONE = "rollout_done"  # the rollout's data reached the loop
    TRAIN_DONE = "train_done"  # every optimizer step of the step ran
    CHECKPOINT_DATA_SAVED = "checkpoint_data_saved"  # mid-save: the data source's state is written, no trainer's
    CHECKPOINT_SAVED = "checkpoint_saved"  # every role's checkpoint of this step is written
    PUSH_TRANSFER_STARTED = "push_transfer_started"  # a push found its engines alive and begins moving weights
    WEIGHTS_PUSHED = "weights_pushed"  # the engines hold the weights this step trained
    STEP_DONE = "step_done"  # the step's records are logged; `data["metrics"]`
    EVAL_DONE = "eval_done"  # `data["metrics"]`: the eval's metrics


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event:
    kind: RunEvent
    rollout_id: int | None = None
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)


Handler = Callable[[Event], None]


class EventBus:
    """Subscribers by event kind; `publish` calls each, in subscription order, those subscribed `last` after
    every other (a fault injector's hang blocks the publishing thread: the watchdog and the display must have
    heard of the phase first)."""

    def __init__(self) -> None:
        self._handlers: dict[RunEvent, list[Handler]] = {}
        self._last: dict[RunEvent, list[Handler]] = {}

    def subscribe(self, kinds: RunEvent | tuple[RunEvent, ...], handler: Handler, *, last: bool = False) -> None:
        table = self._last if last else self._handlers
        for kind in kinds if isinstance(kinds, tuple) else (kinds,):
            table.setdefault(kind, []).append(handler)

    def unsubscribe(self, handler: Handler) -> None:
        for handlers in (*self._handlers.values(), *self._last.values()):
            while handler in handlers:
                handlers.remove(handler)

    def publish(self, kind: RunEvent, rollout_id: int | None = None, **data: Any) -> None:
        event = Event(kind=kind, rollout_id=rollout_id, data=data)
        for handler in [*self._handlers.get(kind, ()), *self._last.get(kind, ())]:
            handler(event)
