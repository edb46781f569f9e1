"""The engines' start (slime.rollout.manager.engine_nodes.get_failing_fast): an engine, or one node's server of an
engine spanning nodes, that fails while the others still load fails the start at once, not after their start-up timeouts."""

from __future__ import annotations

import threading

import pytest
import ray

from slime.rollout.manager.engine_nodes import get_failing_fast


@ray.remote(num_cpus=0)
class _Server:
    """Stands in for an engine actor's `wait_until_ready`: still loading (never ends here), failed, or ready."""

    def wait_until_ready(self, outcome: str) -> str:
        if outcome == "loading":
            threading.Event().wait()
        if outcome == "failed":
            raise RuntimeError("engine 3 exited with status 1 before becoming healthy; last log lines: CUDA OOM")
        return outcome


@pytest.mark.timeout(120)  # waiting for the loading server's answer first would hang here
def test_the_first_failure_raises_without_waiting_for_the_refs_before_it():
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        servers = [_Server.remote() for _ in range(3)]
        with pytest.raises(ray.exceptions.RayTaskError, match="engine 3 exited with status 1"):
            get_failing_fast(
                [servers[0].wait_until_ready.remote("loading"), servers[1].wait_until_ready.remote("failed")]
            )
        urls = [f"http://10.0.0.{i}:15000" for i in (2, 1)]  # answers in the refs' order, whatever order they end in
        assert get_failing_fast([servers[2].wait_until_ready.remote(url) for url in urls]) == urls
    finally:
        ray.shutdown()
