"""The phase watchdog: a phase running past `runtime.phase_timeout_s` (startup: `runtime.startup_timeout_s`) gets
every process's stacks dumped.

Each Ray actor of the run calls `arm_stack_dump()` (slime.rollout.manager.stack_dump) when it starts: SIGUSR1 then
makes faulthandler write every thread's Python stack (C-level, so a thread stuck in a sleep, a lock or native code
still answers) to `<run dir>/stacks/.armed/<pid>.txt`. The driver's `Watchdog` follows the phases the driver enters
(it subscribes to RunEvent.PHASE_STARTED) and polls the current one from its own thread; past the limit it dumps the
driver's own stacks, signals every armed actor, keeps the non-empty dumps as `stacks/<pid>.txt` (headed by the
process's command line), and calls `on_fire(message)` (the driver interrupts its main thread, tears down and reports
status "hung").
If the main thread does not begin its teardown within `grace_s`, `on_stuck()` forces the exit. From the
teardown phase on the watchdog rests (teardown bounds its own waits).

The stacks directory comes through the environment (`STACKS_ENV`), which a local Ray cluster's workers
inherit from the driver. py-spy needs ptrace, which containers often deny; faulthandler needs nothing.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from slime.driver.events import Event, EventBus, RunEvent
from slime.rollout.manager.stack_dump import ARMED, DUMP_SIGNAL

logger = logging.getLogger(__name__)

TEARDOWN = "teardown"  # the phase (slime.config.schema.RUN_PHASES) from which on the watchdog rests
STARTUP = "startup"


@dataclass(frozen=True, kw_only=True)
class PhaseLimits:
    """The most seconds a phase may run (None: unwatched). Startup (Ray, the trainer's model load, the engines'
    launch) often takes far longer than a step, so it has a limit of its own; None there: `phase_s` applies."""

    phase_s: float | None
    startup_s: float | None = None

    @classmethod
    def of_config(cls, runtime) -> PhaseLimits:
        """From slime.config.schema.RuntimeConfig."""
        return cls(phase_s=runtime.phase_timeout_s, startup_s=runtime.startup_timeout_s)

    @property
    def armed(self) -> bool:
        return self.phase_s is not None or self.startup_s is not None

    def of(self, phase: str) -> tuple[float | None, str]:
        """(seconds, the config key that set them) for `phase`."""
        if phase == STARTUP and self.startup_s is not None:
            return self.startup_s, "runtime.startup_timeout_s"
        return self.phase_s, "runtime.phase_timeout_s"

    @property
    def poll_s(self) -> float:
        return min(1.0, *(limit / 4 for limit in (self.phase_s, self.startup_s) if limit is not None))


def dump_stacks(stacks_dir: Path, *, settle_s: float = 2.0) -> list[Path]:
    """The driver's and every armed actor's stacks as `stacks_dir/<pid>.txt`; returns the files written."""
    stacks_dir.mkdir(parents=True, exist_ok=True)
    own = stacks_dir / f"{os.getpid()}.txt"
    with own.open("w") as out:
        out.write(f"# pid {os.getpid()} (driver): {_cmdline(os.getpid())}\n")
        out.flush()
        faulthandler.dump_traceback(file=out, all_threads=True)
    written = [own]
    armed = sorted((stacks_dir / ARMED).glob("*.txt"))
    signalled = []
    for path in armed:
        pid = int(path.stem)
        try:
            os.kill(pid, DUMP_SIGNAL)
            signalled.append(path)
        except ProcessLookupError:  # an actor that ended (or lives on another node)
            continue
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and not all(p.stat().st_size for p in signalled):
        time.sleep(0.1)
    time.sleep(0.2)  # the last lines of a dump that has begun
    for path in signalled:
        text = path.read_text(errors="replace")
        if text:
            target = stacks_dir / path.name
            target.write_text(f"# pid {path.stem}: {_cmdline(int(path.stem))}\n{text}")
            written.append(target)
    return written


def remove_armed(stacks_dir: Path) -> None:
    """At the end of a run: the staging files go; `stacks/` itself only if nothing was dumped into it."""
    shutil.rmtree(stacks_dir / ARMED, ignore_errors=True)
    if stacks_dir.is_dir() and not any(stacks_dir.iterdir()):
        stacks_dir.rmdir()


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()).strip()[:200]
    except psutil.Error:
        return "?"


class Watchdog:
    """Follows the phases published on `events` (`data["started"]` on time.monotonic()); a daemon thread polls
    the current one.

    Args:
        limits: the most seconds each watched phase may take.
        on_fire: called once, from the watchdog thread, with the message naming the phase, after the dump.
        on_stuck: called if the main thread has not left the hung phase `grace_s` after `on_fire`.
    """

    grace_s = 60.0  # seconds the main thread has to leave a hung phase after `on_fire`

    def __init__(
        self,
        events: EventBus,
        limits: PhaseLimits,
        stacks_dir: Path,
        *,
        on_fire: Callable[[str], None],
        on_stuck: Callable[[], None],
    ):
        self.limits, self.stacks_dir = limits, stacks_dir
        self.current: tuple[str, int | None, float] | None = None  # (phase, rollout id, started) under watch
        events.subscribe(RunEvent.PHASE_STARTED, self._on_phase)
        self.on_fire, self.on_stuck = on_fire, on_stuck
        self.fired: str | None = None  # the message, once fired
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="slime-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _on_phase(self, event: Event) -> None:
        self.current = (event.data["phase"], event.rollout_id, event.data["started"])  # one atomic assignment

    def _watch(self) -> None:
        while not self._stop.wait(self.limits.poll_s):
            watched = self.current
            if watched is None:
                continue
            phase, rollout_id, started = watched
            if phase == TEARDOWN:  # teardown bounds its own waits
                return
            limit_s, key = self.limits.of(phase)
            if limit_s is None or time.monotonic() - started <= limit_s:
                continue
            where = f" of rollout {rollout_id}" if rollout_id is not None and rollout_id >= 0 else ""
            self.fired = f"phase {phase}{where} exceeded {key}={limit_s:g}s; stacks in {self.stacks_dir}"
            logger.error("watchdog: %s", self.fired)
            try:
                files = dump_stacks(self.stacks_dir)
                logger.error("watchdog: dumped the stacks of %d processes", len(files))
            finally:
                self.on_fire(self.fired)
            if not self._stop.wait(self.grace_s) and self.current is watched:
                self.on_stuck()
            return
