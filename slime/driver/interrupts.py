"""Ctrl-C and SIGTERM for a run: a graceful teardown first, a forced one on a second signal.

`Interrupts` owns the driver's SIGINT/SIGTERM handlers for the life of a run:

- installed explicitly, whatever the parent left (a shell starts background jobs with SIGINT
  ignored, and `ray.init` replaces the SIGTERM handler with a bare `sys.exit`), so a signal always
  reaches the run; `reinstall()` puts them back after a library replaced them;
- while the run works, a signal raises `RunInterrupted` (a `KeyboardInterrupt`) in the main thread,
  so the driver's `finally` blocks tear everything down and `result.json` records the phase. Code
  that waits in native code (`ray.get`) may turn it into a plain `KeyboardInterrupt`: `interrupted()`
  rebuilds the `RunInterrupted` from the signal recorded here;
- once teardown has begun (`begin_teardown()`, or after the first signal), a further signal does
  not abort it half-way: it kills every process the run started (all descendants of this process),
  calls `on_force` (which writes `result.json`), and exits with 128 + the signal number at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

import psutil

HANDLED = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached the driver; `exit_code` is 128 + the signal number (130, 143)."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(signal.Signals(self.signum).name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def kill_descendants() -> int:
    """SIGKILL every process below this one (Ray daemons and workers, the router, engines); the count."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=10)
    return len(children)


class Interrupts:
    """The run's signal policy (see the module docstring). Use as a context manager in the main thread.

    Args:
        on_force: called with the signal number before a forced exit (write what must survive).
    """

    def __init__(self, on_force: Callable[[int], None]):
        self.on_force = on_force
        self.received: int | None = None  # the first signal's number
        self.reason: str | None = None  # why `interrupt` stopped the run (said instead of "SIGINT received")
        self._tearing_down = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signal handlers can only be installed from the main thread")
        self._previous = {sig: signal.getsignal(sig) for sig in HANDLED}
        self.reinstall()
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def reinstall(self) -> None:
        """(Re)install the handlers; call after anything that may have replaced them (ray.init)."""
        for sig in HANDLED:
            signal.signal(sig, self._handle)

    def interrupted(self, exc: KeyboardInterrupt) -> RunInterrupted:
        """The `RunInterrupted` behind `exc` (SIGINT when no signal was recorded: a Ctrl-C from Python)."""
        if isinstance(exc, RunInterrupted):
            return exc
        return RunInterrupted(self.received or signal.SIGINT)

    def interrupt(self, reason: str) -> None:
        """From another thread (the watchdog): stop the run as a Ctrl-C would, saying `reason`."""
        self.reason = reason
        os.kill(os.getpid(), signal.SIGINT)

    def force(self, exit_code: int) -> None:
        """From another thread, when the main thread no longer reacts: what a second SIGINT does, with `exit_code`."""
        _say("the run does not stop: killing every process of the run")
        try:
            kill_descendants()
            self.on_force(signal.SIGINT)
        finally:
            exit_now(exit_code)

    def begin_teardown(self) -> None:
        """From here on a signal forces the exit instead of interrupting the teardown."""
        self._tearing_down = True

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if not self._tearing_down:
            self.received = signum
            _say(f"\n{self.reason or name + ' received'}: stopping the run (again to force)")
            self._tearing_down = True  # a second signal, even before teardown proper, forces
            raise RunInterrupted(signum)
        try:
            _say(f"\n{name} received during teardown: killing every process of the run")
            kill_descendants()
            self.on_force(signum)
        finally:
            exit_now(128 + signum)


def exit_now(code: int) -> None:
    """Flush and leave without interpreter finalisation. After a signal cut `ray.init` short, Ray's
    half-built core worker can crash the interpreter's exit (SIGSEGV instead of 130); for any run the
    finalisation (torch, Ray, wandb) costs ~1.5 s and adds nothing. A single (non-multirun) run that
    has torn down and written its result ends here.

    Called from a signal handler, the main thread may be inside a write to a log file or a standard stream: that
    stream refuses a reentrant flush (`RuntimeError: reentrant call inside <_io.BufferedWriter ...>`), which
    `logging.shutdown` would re-raise (and the interrupted logging call then swallow as a logging error) before
    the exit; without `raiseExceptions` it flushes every other handler and goes on."""
    logging.raiseExceptions = False
    logging.shutdown()
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        sys.stderr.flush()
    os._exit(code)


def _say(message: str) -> None:
    """To stderr, unless it is gone (a closed terminal or pipe must not stop the teardown) or busy (RuntimeError:
    the signal landed inside a write to stderr)."""
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        print(message, file=sys.stderr, flush=True)
