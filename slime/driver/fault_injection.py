"""Fault injection for the tests of the signal path and the watchdog (`debug.signal_at`, `debug.hang_at`).

Nothing here runs unless a debug option asks: `FaultInjector.attach` returns None for a run that sets neither.
The injector follows the run through its phase events (slime.driver.events):

- `debug.signal_at` ("PHASE" or "PHASE:ROLLOUT_ID", with `debug.signal` and `debug.signal_delay_s`): on entering
  that phase a timer thread sends the signal to this process, so it arrives while the phase is under way, as a
  user's Ctrl-C would (SIGKILL: every process of the run dies at once, as in a crash);
- `debug.hang_at`: on entering that phase (a save: mid-way, once its data-source state is written and the
  trainer's not) training rank 0 sleeps forever and the driver waits on it (the watchdog's test);
- `debug.nonfinite_at` ("train" or "train:ROLLOUT_ID"): on entering that train phase every training rank's first
  trainable parameter gets a NaN gradient in the step's first backward (`train.on_nonfinite`'s test);
- `debug.kill_engine_at`: on entering that phase engine 0's server process is SIGKILLed (its pid from the run's
  engines.json), as an out-of-memory kill would (fault tolerance's test); in a weight_sync phase, once the push
  found its engines alive and begins moving weights (RunEvent.PUSH_TRANSFER_STARTED), so that the push meets the
  death rather than the restart check before it;
- `debug.kill_router_at`: on entering that phase the router the run launched is SIGKILLed (its pid from engines.json).

A kill at a rollout phase ("rollout:K") fires when the loop asks the rollout manager for rollout K
(RunEvent.ROLLOUT_STARTED): after the loop's check for dead engines at the step's start, which would otherwise find
the process gone (or not yet, by a few milliseconds) and make the fault the check's rather than the rollout's.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

from slime.config.schema import DebugConfig, PhasePoint
from slime.driver.events import Event, EventBus, RunEvent
from slime.driver.interrupts import kill_descendants

# kills that wait for an event after their phase began: the push's transfer, the loop asking for the rollout
DEFERRED_KILLS = {("engine", "weight_sync"), ("engine", "rollout"), ("router", "rollout")}


class FaultInjector:
    """One run's injected faults; each fires once."""

    def __init__(self, debug: DebugConfig, run_dir: Path):
        # validated (slime.config.rules.check_debug) with the same parser
        self.signal_at = PhasePoint.parse(debug.signal_at) if debug.signal_at else None
        self.signum = int(getattr(signal, debug.signal))
        self.delay_s = debug.signal_delay_s
        self.hang_at = PhasePoint.parse(debug.hang_at) if debug.hang_at else None
        self.nonfinite_at = PhasePoint.parse(debug.nonfinite_at) if debug.nonfinite_at else None
        self.kill_at = {  # what a kill hook kills (as engines.json lists it) -> when
            kind: PhasePoint.parse(value) if value else None
            for kind, value in (("engine", debug.kill_engine_at), ("router", debug.kill_router_at))
        }
        self.run_dir = run_dir
        self.trainer = None  # the actor's TrainGroup, once the loop starts (a hang needs a rank)

    @classmethod
    def attach(cls, debug: DebugConfig, events: EventBus, run_dir: Path) -> FaultInjector | None:
        """The injector `debug` asks for, subscribed to `events` of the run writing to `run_dir`; None when it asks
        for none."""
        points = (debug.signal_at, debug.hang_at, debug.nonfinite_at, debug.kill_engine_at, debug.kill_router_at)
        if all(point is None for point in points):
            return None
        injector = cls(debug, run_dir)
        # last: a hang blocks the publisher, and the watchdog and the display must have heard of the phase first
        events.subscribe(RunEvent.PHASE_STARTED, injector._on_phase, last=True)
        events.subscribe(RunEvent.CHECKPOINT_DATA_SAVED, injector._on_data_saved, last=True)
        events.subscribe(RunEvent.LOOP_STARTED, injector._on_loop_started)
        events.subscribe(RunEvent.PUSH_TRANSFER_STARTED, injector._on_push_transfer)
        events.subscribe(RunEvent.ROLLOUT_STARTED, injector._on_rollout_asked)
        return injector

    def _on_loop_started(self, event: Event) -> None:
        self.trainer = event.data["trainer"]

    def _on_phase(self, event: Event) -> None:
        phase = event.data["phase"]
        if self.signal_at is not None and self.signal_at.matches(phase, event.rollout_id):
            self.signal_at = None
            timer = threading.Timer(self.delay_s, _send_signal, args=(self.signum,))
            timer.daemon = True
            timer.start()
        if phase != "save":  # after the signal's timer: a hang there meets the signal; a save hangs mid-way
            self._hang_if_due(phase, event.rollout_id)
        for kind in self.kill_at:
            if (kind, phase) not in DEFERRED_KILLS:
                self._kill_if_due(kind, phase, event.rollout_id)
        if self.nonfinite_at is not None and self.nonfinite_at.matches(phase, event.rollout_id) and self.trainer:
            self.nonfinite_at = None
            self.trainer.run_on_backends(_poison_next_gradient)

    def _on_push_transfer(self, event: Event) -> None:
        self._kill_if_due("engine", "weight_sync", event.rollout_id)

    def _on_rollout_asked(self, event: Event) -> None:
        for kind in self.kill_at:
            self._kill_if_due(kind, "rollout", event.rollout_id)

    def _kill_if_due(self, kind: str, phase: str, rollout_id: int | None) -> None:
        point = self.kill_at[kind]
        if point is not None and point.matches(phase, rollout_id):
            self.kill_at[kind] = None
            _kill_listed(self.run_dir, kind)

    def _on_data_saved(self, event: Event) -> None:
        self._hang_if_due("save", event.rollout_id)

    def _hang_if_due(self, phase: str, rollout_id: int | None) -> None:
        if self.hang_at is not None and self.hang_at.matches(phase, rollout_id) and self.trainer is not None:
            self.hang_at = None
            self.trainer.run_on_rank(0, _injected_hang)


def _injected_hang() -> None:
    """On a training rank: never returns (the watchdog names the phase and dumps this stack)."""
    while True:
        time.sleep(3600)


def _poison_next_gradient(backend) -> None:
    """On a training rank: the next backward gives the first trainable parameter a NaN gradient, once."""
    chunks = backend.model if isinstance(backend.model, list) else [backend.model]  # megatron: its model chunks
    param = next(p for chunk in chunks for p in chunk.parameters() if p.requires_grad)
    handle = None

    def to_nan(grad):
        handle.remove()
        return grad * float("nan")

    handle = param.register_hook(to_nan)


def _kill_listed(run_dir: Path, kind: str) -> None:
    """SIGKILL by the pids the run's engines.json records: "engine", engine 0's server; "router", each router the run
    launched (a joined one lists no pid)."""
    listed = json.loads((run_dir / "engines.json").read_text())
    for entry in listed["engines"][:1] if kind == "engine" else listed.get("routers", []):
        if entry.get("pid"):
            os.kill(entry["pid"], signal.SIGKILL)


def _send_signal(signum: int) -> None:
    """debug.signal_at's signal to this process; SIGKILL kills every process of the run first (a crash)."""
    if signum == signal.SIGKILL:
        kill_descendants()
    os.kill(os.getpid(), signum)
