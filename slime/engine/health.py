"""The fleet's engine health checks (`rollout.fault_tolerance`): GET /health of every registered engine, only
while the engines serve.

SGLang's GET /health is a one-token generation (sglang/srt/entrypoints/http_server.py: `health_generate`): it
waits while generation is paused and answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) without a token; on
an engine that released its memory (colocation) it would generate on memory that is gone, and one in flight
breaks `release_memory_occupation`'s assertion that the engine is idle
(sglang/srt/managers/scheduler_components/weight_updater.py). So, as slime's `RolloutHealthMonitor` rests
while engines are offloaded and around weight updates (slime/utils/health_monitor.py), probes run only while
no hold is on:

    "push"      the driver's weight push, from its first step to its last (WeightPush, via the rollout manager)
    "paused"    pause_generation ... continue_generation
    "released"  release_memory ... until every engine has its memory back (colocation)

`HealthGate.hold()` waits for a round of probes in flight to end (at most one probe timeout), and a round that
a hold overlapped counts for nothing: an engine that was paused or released under it proved nothing.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Protocol

from slime.config.schema import FaultToleranceConfig
from slime.engine.client import EngineClient

logger = logging.getLogger(__name__)
HEALTH_PATH = "/health"


class HealthGate:
    """When probes may run: never while a hold is on; a hold waits for the round in flight."""

    def __init__(self, wait_s: float):
        self._wait_s = wait_s  # the longest a round can take (one probe timeout; probes run in parallel)
        self._cond = threading.Condition()
        self._holds: set[str] = set()
        self._probing = False
        self._epoch = 0  # counts holds: a round is void when a hold began during it

    def hold(self, reason: str) -> None:
        """No probe from now until `release(reason)`; returns once no round is in flight."""
        with self._cond:
            self._holds.add(reason)
            self._epoch += 1
            if not self._cond.wait_for(lambda: not self._probing, timeout=self._wait_s + 5.0):
                logger.warning("engine health probes still in flight %.0f s into hold %r", self._wait_s + 5, reason)

    def release(self, reason: str) -> None:
        with self._cond:
            self._holds.discard(reason)

    def holds(self) -> set[str]:
        with self._cond:
            return set(self._holds)

    def begin_round(self) -> Optional[int]:
        """The round's token, or None while held (no round then)."""
        with self._cond:
            if self._holds:
                return None
            self._probing = True
            return self._epoch

    def end_round(self, token: int) -> bool:
        """Whether the round counts: no hold began while it ran."""
        with self._cond:
            self._probing = False
            self._cond.notify_all()
            return token == self._epoch


class Probed(Protocol):
    """What the monitor needs of the fleet."""

    def probe_targets(self) -> list[tuple[int, str]]: ...  # (rank, url) of every registered live engine

    def client(self, url: str) -> EngineClient: ...

    def mark_dead(self, rank: int, why: str) -> None: ...


class HealthMonitor:
    """A daemon thread: every `health_check_interval_s`, while the gate is open, GET /health of every target
    in parallel; each that fails (or is slower than `health_check_timeout_s`) is marked dead."""

    def __init__(self, ft: FaultToleranceConfig, fleet: Probed, gate: HealthGate, stop: threading.Event):
        self.ft = ft
        self.fleet = fleet
        self.gate = gate
        self.stop = stop
        self.thread = threading.Thread(target=self._loop, name="engine-health", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(self.ft.health_check_interval_s):
            token = self.gate.begin_round()
            if token is None:
                continue
            try:
                failed = self._probe_all(self.fleet.probe_targets())
            finally:
                counts = self.gate.end_round(token)
            if not counts:
                continue
            for rank in failed:
                self.fleet.mark_dead(rank, "failed its health check")

    def _probe_all(self, targets: list[tuple[int, str]]) -> list[int]:
        if not targets:
            return []
        timeout = self.ft.health_check_timeout_s
        with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
            healthy = list(
                pool.map(lambda t: self.fleet.client(t[1]).is_healthy(HEALTH_PATH, timeout=timeout), targets)
            )
        return [rank for (rank, _), ok in zip(targets, healthy) if not ok]
