"""How a Ray worker of the run logs (the trainer ranks, the rollout manager): every record at the run's
`debug.log_level` goes to the worker's stderr as one line, `LEVEL logger: message`, which Ray forwards to the driver.
There the console (slime/driver/console.py) writes every forwarded line to `logs/workers.log` and also shows, on
the terminal's stderr, the lines that are records the driver's own would show: slime's warnings and anyone's errors.

Without this a worker's root logger has no handler and Python's last resort prints a warning as its bare message
(the level and the logger lost) and drops every INFO record.
"""

from __future__ import annotations

import logging
import os
import re
import sys

LEVEL_ENV = "SLIME_WORKER_LOG_LEVEL"  # set by the driver for every worker: the run's debug.log_level
WORKER_RECORD_FORMAT = "%(levelname)s %(name)s: %(message)s"
_RECORD_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) ([\w.]+): ")


class _WorkerHandler(logging.StreamHandler):
    """The one handler `configure_worker_logging` adds (found again by its type, so a second call adds none)."""


def configure_worker_logging() -> None:
    """Give this worker process's root logger the handler the module docstring describes (idempotent)."""
    root = logging.getLogger()
    if any(isinstance(handler, _WorkerHandler) for handler in root.handlers):
        return
    handler = _WorkerHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(WORKER_RECORD_FORMAT))
    root.addHandler(handler)
    root.setLevel(os.environ.get(LEVEL_ENV, "INFO"))


def record_of(line: str) -> tuple[int, str] | None:
    """(level number, logger name) of a worker's line written by that handler; None for any other line."""
    found = _RECORD_LINE.match(line)
    return (logging.getLevelName(found.group(1)), found.group(2)) if found else None
