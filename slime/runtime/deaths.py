"""A run's parts that die under it: the errors naming them, raised by the rollout manager (a failed rollout or eval)
and the driver's weight push, read by the loop to decide whether fault tolerance may run the call again."""

from __future__ import annotations


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
