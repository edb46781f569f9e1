"""A local Ray node that misses Ray's fixed 30 s registration window (a saturated machine) is started again once."""

from __future__ import annotations

import pytest

from slime.runtime import ray_session

TIMEOUT = "The current node timed out during startup. This could happen because some of the raylet failed to startup"


class _Ray:
    """Stands in for `ray.init`/`ray.shutdown` only: the failure being retried cannot be produced on demand."""

    def __init__(self, failures: list[Exception]):
        self.failures, self.calls = failures, []

    def init(self, **kwargs):
        self.calls.append("init")
        if self.failures:
            raise self.failures.pop(0)

    def shutdown(self):
        self.calls.append("shutdown")


@pytest.mark.parametrize(
    "failures,calls,raises",
    [
        ([Exception(TIMEOUT)], ["init", "shutdown", "kill", "init"], None),
        ([Exception(TIMEOUT), Exception(TIMEOUT)], ["init", "shutdown", "kill", "init"], TIMEOUT),
        ([ValueError("num_gpus must be >= 0")], ["init"], "num_gpus"),  # other errors are not retried
    ],
)
def test_a_timed_out_local_start_is_retried_once_after_its_daemons_are_killed(monkeypatch, failures, calls, raises):
    fake = _Ray(failures)
    monkeypatch.setattr(ray_session, "ray", fake)
    monkeypatch.setattr(ray_session, "kill_descendants", lambda: fake.calls.append("kill") or 0)
    if raises:
        with pytest.raises(Exception, match=raises):
            ray_session._start_local(num_cpus=2, num_gpus=0, log_to_driver=False)
    else:
        ray_session._start_local(num_cpus=2, num_gpus=0, log_to_driver=False)
    assert fake.calls == calls
