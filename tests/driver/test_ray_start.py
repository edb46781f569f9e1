"""A local Ray node that misses Ray's fixed 30 s registration window (a saturated machine) is started again once; a
cluster.ray_address where no head answers stops the run at once."""

from __future__ import annotations

import socket

import pytest
import ray

from slime.config.schema import ClusterConfig
from slime.driver import ray_session
from slime.net import free_port
from tests.helpers.raylets import local_raylets

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


def test_a_ray_address_where_no_head_answers_stops_at_once_naming_the_key():
    """ray.init itself would retry such a head for minutes (measured: still retrying after 5 min)."""
    port = free_port()
    with pytest.raises(RuntimeError) as info:
        with ray_session.ray_session(
            ClusterConfig(ray_address=f"127.0.0.1:{port}"), num_bundles=1, log_to_driver=False
        ):
            pass
    assert str(info.value).startswith(
        f"cluster.ray_address=127.0.0.1:{port}: no Ray head answers at 127.0.0.1:{port} ("
    )
    assert "ray start --head" in str(info.value) and not ray.is_initialized()


def test_a_head_that_accepts_connections_is_joined():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        ray_session.check_head_answers(f"ray://127.0.0.1:{port}")
        ray_session.check_head_answers(f"127.0.0.1:{port}")
    ray_session.check_head_answers("auto")


def test_a_null_ray_address_starts_its_own_cluster_beside_a_running_one():
    """A running head (`ray start`, or Ray's Cluster) writes its address where Ray's default `ray.init()` looks
    (ray._private.services.get_ray_address_from_environment): cluster.ray_address=null still starts a cluster of its
    own, sized as asked, rather than joining that one."""
    with local_raylets(1) as running:
        assert ray._private.services.find_bootstrap_address(None) == running.address
        with ray_session.ray_session(ClusterConfig(), num_bundles=3, log_to_driver=False):
            assert ray.get_runtime_context().gcs_address != running.address
            assert ray.cluster_resources()["CPU"] >= 3
