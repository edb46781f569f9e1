"""What result.json reports about a run, and the phase it is in (the heartbeat)."""

from __future__ import annotations

import dataclasses
import logging
import time

from slime.driver.events import EventBus, RunEvent

logger = logging.getLogger("slime.driver.driver")


@dataclasses.dataclass
class RunState:
    """The phase reached, progress and the last metrics.

    Every phase change is logged with the time the phase took (the heartbeat) and published on `events`
    (RunEvent.PHASE_STARTED, with its start on time.monotonic()), which the watchdog (slime.driver.watchdog)
    and the progress display follow.
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
    hung: str | None = None  # the watchdog's message once a phase overran runtime.phase_timeout_s
    events: EventBus = dataclasses.field(default_factory=EventBus, repr=False)

    def enter(self, phase: str, rollout_id: int | None = None) -> None:
        now = time.monotonic()
        if self.phase != "config":
            logger.info("%s done in %.2fs", _phase_name(self.phase, self.phase_rollout), now - self.phase_started)
        logger.info("%s started", _phase_name(phase, rollout_id))
        self.phase, self.phase_rollout, self.phase_started = phase, rollout_id, now
        self.events.publish(RunEvent.PHASE_STARTED, rollout_id, phase=phase, started=now)


def _phase_name(phase: str, rollout_id: int | None) -> str:
    return f"phase {phase}" + (f" (rollout {rollout_id})" if rollout_id is not None else "")
