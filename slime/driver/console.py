"""What the terminal shows while a run runs, and where everything else goes (`logger.console`).

The rule for stdout and stderr:

    stdout  the run's own report, and only that: the plan summary (at most 30 lines, slime/plan/plan_summary.py),
            one line per finished rollout step, and the end summary naming every file of the run
            (slime/tracking/summary.py). On a terminal (with `logger.progress=true`) a live display sits below the
            step lines (slime/tracking/progress.py): a bar over the rollout steps, the phase under way, the last
            step's figures. `logger.console=verbose` adds the resolved config and the derived values before the
            plan summary.
    stderr  what went wrong: slime's warnings and every library's errors (log records), a configuration error found
            once the run started, a failed run's traceback, the interrupt messages. `logger.console=verbose` adds
            every log record at `debug.log_level` and the output of the Ray workers. While the live display is drawn
            and stderr is the same terminal, these lines are printed above the display (through it), never across it,
            as is what the process's C code and its children write to the terminal's descriptors
            (slime/tracking/fd_capture.py).

Everything else goes to files of the run directory:

    main.log          every log record at debug.log_level: each phase's start and end with its time, the weight
                      hand-off steps, slow phases and rollout group counts (off a terminal), eval means, the
                      libraries' warnings (Ray's banners, Python warnings)
    logs/workers.log  what the Ray workers (trainer ranks, the rollout manager) print, their log records included
                      (slime/rollout/manager/worker_logging.py; their warnings and errors also reach stderr as the
                      driver's do), each line prefixed with its actor and pid: `(FSDPBackend(rank=0) pid=8043) ...`
    logs/router.log, logs/engine_<i>.log   the router's and each engine server's own output

`logger.console=plain` also turns the Hugging Face libraries' progress bars off (transformers' "Loading weights",
"Writing model shards") on the driver and in the workers: HF_HUB_DISABLE_PROGRESS_BARS=1.

Hydra writes no log of the job: conf/config.yaml sets `hydra/job_logging` to `none`, so a configuration error or a
dry run leaves no main.log; `RunConsole.open` adds it once the config is valid and the run directory is made, and
takes the root logger's console handler Hydra set up for its own messages (hydra/hydra_logging: a sweep's "Launching
N jobs") off for the run's time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.text import Text

from slime.config.schema import LoggerConfig
from slime.driver.events import EventBus, RunEvent
from slime.rollout.manager.worker_logging import record_of
from slime.tracking.progress import RunProgress

RECORD_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # main.log's (Hydra's default format)
PLAIN_RECORD_FORMAT = "%(levelname)s %(name)s: %(message)s"  # a warning on the terminal
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # read by huggingface_hub (and so transformers) at import
SLIME_LOGGERS = ("slime", "__main__")


class _TerminalRecords(logging.Handler):
    """The log records the terminal gets: every one with `verbose`; else slime's warnings and anyone's errors."""

    def __init__(self, console: RunConsole, *, verbose: bool):
        super().__init__()
        self.console, self.verbose = console, verbose
        self.setFormatter(logging.Formatter(RECORD_FORMAT if verbose else PLAIN_RECORD_FORMAT))

    def filter(self, record: logging.LogRecord) -> bool:
        return self.verbose or _terminal_shows((record.levelno, record.name))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.problem(self.format(record))
        except Exception:  # logging's contract: a handler never raises into the code that logged
            self.handleError(record)


class RunConsole:
    """The terminal of one run: its report on stdout, problems on stderr, the live display, and the logs' files.

    Made once the config is resolved (`logger`: its logger section; `total`: train.num_rollout); `open(run_dir)`
    attaches the log files, `follow(events)` starts the display, `finish(summary)` ends it with the end summary,
    `close()` detaches everything (a sweep runs several jobs in one process)."""

    def __init__(
        self,
        logger: LoggerConfig,
        *,
        total: int,
        steps_per_rollout: int = 1,
        stdout: IO[str] | None = None,
        stderr: IO[str] | None = None,
    ):
        self.verbose = logger.console == "verbose"
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.terminal = Console(file=self.stdout, highlight=False, emoji=False)
        self._stderr_is_terminal = _is_terminal(self.stderr)
        self.progress = RunProgress(
            total=total,
            console=self.terminal,
            # rich's reading of the terminal: a tty that is not TERM=dumb, or TTY_INTERACTIVE=1 / FORCE_COLOR
            live=logger.progress and self.terminal.is_interactive,
            groups=logger.progress,
            steps_per_rollout=steps_per_rollout,
            slow_phase_s=logger.progress_every_s,
        )
        self.run_dir: Path | None = None
        self._handlers: list[logging.Handler] = []
        self._detached: list[logging.Handler] = []  # the root's handlers printing to the terminal before the run
        self._followed: tuple[EventBus, list] | None = None
        self._saved_env: dict[str, str | None] = {}
        self._workers_log: IO[str] | None = None
        self._lock = threading.Lock()  # Ray's forwarding thread writes workers.log

    # ---- setting up and tearing down -------------------------------------------------------------------------
    def open(self, run_dir: Path) -> RunConsole:
        """From here on every record goes to `<run_dir>/main.log` and the terminal's share to the terminal; Python
        warnings become records (py.warnings); in plain mode the HF progress bars are off."""
        self.run_dir = run_dir
        main_log = logging.FileHandler(run_dir / "main.log")
        main_log.setFormatter(logging.Formatter(RECORD_FORMAT))
        self._handlers = [main_log, _TerminalRecords(self, verbose=self.verbose)]
        root = logging.getLogger()
        self._detached = [handler for handler in root.handlers if _prints_to_terminal(handler)]
        for handler in self._detached:
            root.removeHandler(handler)
        for handler in self._handlers:
            root.addHandler(handler)
        logging.captureWarnings(True)
        self._saved_env = {key: os.environ.get(key) for key in self.worker_env}
        os.environ.update(self.worker_env)
        return self

    def close(self) -> None:
        """Stop the display and detach what `open` and `follow` attached."""
        self.progress.close()
        if self._followed is not None:
            events, handlers = self._followed
            for handler in handlers:
                events.unsubscribe(handler)
            self._followed = None
        root = logging.getLogger()
        for handler in self._handlers:
            root.removeHandler(handler)
            handler.close()
        for handler in self._detached:
            root.addHandler(handler)
        self._handlers, self._detached = [], []
        logging.captureWarnings(False)
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}
        with self._lock:
            if self._workers_log is not None:
                self._workers_log.close()
                self._workers_log = None

    @property
    def worker_env(self) -> dict[str, str]:
        """Environment for the driver and the workers: plain mode turns the HF progress bars off."""
        return {} if self.verbose else dict(QUIET_ENV)

    @property
    def group_poll_s(self) -> float | None:
        """How often the loop fetches a rollout's group counts for the display (None: never)."""
        return self.progress.poll_s

    # ---- what is printed -------------------------------------------------------------------------------------
    def report(self, text: str) -> None:
        """Part of the run's report: stdout (above the live display while it is drawn)."""
        self.terminal.print(Text(text), soft_wrap=True)

    def problem(self, text: str) -> None:
        """A warning, an error or (verbose) a log record or a worker's line: stderr, or above the live display when
        stderr is the terminal it is drawn on. A stderr that is gone is no reason to stop the run."""
        if self.progress.showing and self._stderr_is_terminal:
            self.terminal.print(Text(text), soft_wrap=True)
            return
        with contextlib.suppress(OSError, ValueError):
            self.stderr.write(text + "\n")
            self.stderr.flush()

    def follow(self, events: EventBus) -> None:
        """The display follows the run's phases and steps from here on (and is drawn, on a terminal)."""
        progress = self.progress
        handlers = {
            RunEvent.PHASE_STARTED: lambda e: progress.on_phase(e.data["phase"], e.rollout_id),
            RunEvent.LOOP_STARTED: lambda e: progress.begin(e.data["start"]),
            RunEvent.ROLLOUT_PROGRESS: lambda e: progress.rollout_groups(
                e.rollout_id, e.data["counts"], final=e.data["final"]
            ),
            RunEvent.STEP_DONE: lambda e: progress.step_done(e.rollout_id, e.data["metrics"]),
            RunEvent.EVAL_DONE: lambda e: progress.eval_done(e.rollout_id + 1, e.data["metrics"]),
        }
        for kind, handler in handlers.items():
            events.subscribe(kind, handler)
        self._followed = (events, list(handlers.values()))
        # stray writes to sys.stderr go above the display only when stderr is that terminal
        progress.start(redirect_stderr=self._stderr_is_terminal)

    def finish(self, summary: str, *, outcome: str | None = None) -> None:
        """The end summary, under the display's last frame (the display stops first, saying `outcome`)."""
        self.progress.close(outcome)
        self.report(summary)

    def worker_output(self, batch: dict[str, Any]) -> None:
        """Ray's forwarded lines of a worker (slime.driver.ray_session.WorkerOutput): to logs/workers.log, and to the
        terminal's stderr the records it would show of the driver's own (slime/rollout/manager/worker_logging.py), or
        with verbose every line."""
        pid = batch.get("pid")
        name = batch.get("actor_name") or batch.get("task_name")
        prefix = f"({name} pid={pid})" if name else f"({pid})" if pid in ("raylet", "autoscaler") else f"(pid={pid})"
        lines = [f"{prefix} {line}" for line in batch.get("lines", ())]
        with self._lock:
            if self._workers_log is None and self.run_dir is not None:
                (self.run_dir / "logs").mkdir(exist_ok=True)
                self._workers_log = open(self.run_dir / "logs" / "workers.log", "a", buffering=1)  # noqa: SIM115
            if self._workers_log is not None:
                self._workers_log.write("".join(line + "\n" for line in lines))
        for line, text in zip(lines, batch.get("lines", ())):
            if self.verbose or (batch.get("is_err") and _terminal_shows(record_of(text))):
                self.problem(line)


def _terminal_shows(record: tuple[int, str] | None) -> bool:
    """A record (level number, logger name) the plain terminal shows: anyone's errors, slime's warnings."""
    if record is None:
        return False
    level, name = record
    return level >= logging.ERROR or (level >= logging.WARNING and name.split(".", 1)[0] in SLIME_LOGGERS)


def _prints_to_terminal(handler: logging.Handler) -> bool:
    standard = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    return type(handler) is logging.StreamHandler and handler.stream in standard


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False
