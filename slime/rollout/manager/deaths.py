"""A run's parts that die under it: the errors naming them, raised by the rollout manager (a failed rollout or eval)
and the driver's weight push; `call_recovering`, with which the loop runs a call again once fault tolerance
restarted what died; `failure_text`, a failure as result.json and a failed push name it. No Ray at import: the
launcher reads it before the config is known to be good."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from slime.config.schema_rollout import FaultToleranceConfig

logger = logging.getLogger(__name__)
T = TypeVar("T")


class ComponentDied(RuntimeError):
    """A router or engine of the run died during a call: the call fails naming it. `retryable`: the call may run
    again once fault tolerance restarted what died (a training rollout's data source was put back where the step
    began; an eval draws nothing); without fault tolerance the run stops (exit 3)."""

    def __init__(self, message: str, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable

    def __reduce__(self):  # crosses Ray's process boundary with both fields
        return (type(self), (str(self), self.retryable))


class RouterDied(ComponentDied):
    """A router this run launched is gone: its exit status and log tail (resume with checkpoint.resume=auto)."""


class EngineDied(ComponentDied):
    """An engine's server is gone: its rank, URL, pid and log."""


def call_recovering(
    call: Callable[[int], T], *, fault_tolerance: FaultToleranceConfig, recover: Callable[[], int], redo: str
) -> tuple[T, int]:
    """`call(attempt)` (a rollout manager call, waited for) until it returns: a call that a death cut short runs again
    once `recover()` restarted what died (it returns how many engines it restarted), while fault tolerance is on, the
    death retryable and the attempts within `max_restarts`; any other failure is raised. `redo` says what runs
    again, for the log. Returns (the call's result, the engines restarted)."""
    restarted = 0
    for attempt in range(fault_tolerance.max_restarts + 1):
        try:
            return call(attempt), restarted
        except Exception as exc:  # noqa: BLE001 - raised again unless a death explains it
            died = getattr(exc, "cause", None)  # Ray's wrapper of the manager's own exception
            if not (fault_tolerance.enabled and isinstance(died, ComponentDied) and died.retryable):
                raise
            if attempt == fault_tolerance.max_restarts:
                raise
            logger.warning("%s; %s again once it restarted", died, redo)
            restarted += recover()
    raise AssertionError("unreachable: the last attempt returns or raises")


def failure_text(exc: BaseException) -> str:
    """`Type: message` of a failure: a worker's exception as itself, without the wrapper Ray adds around it (its
    remote traceback, with terminal colours, is on the console and in the worker's log)."""
    cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError's original exception
    if isinstance(cause, Exception):
        exc = cause
    return f"{type(exc).__name__}: {exc}"
