"""A local Ray cluster of several raylets on this machine (Ray's own `ray.cluster_utils.Cluster`): each raylet a
"node" with its own resources and, past the first, its own loopback IP (127.0.0.2, ...), for the multi-node tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

START_ATTEMPTS = 2  # Ray gives a raylet a fixed 30 s to register: a saturated machine may miss it once


@contextlib.contextmanager
def local_raylets(count: int, *, num_cpus: int = 1) -> Iterator:
    """`count` raylets of `num_cpus` CPU slots each, no dashboard; yields the Cluster (its `address` is the GCS's,
    what `cluster.ray_address` takes); every daemon stopped on exit."""
    from ray.cluster_utils import Cluster

    for attempt in range(1, START_ATTEMPTS + 1):
        cluster = Cluster()
        try:
            for index in range(count):
                # each further raylet at its own loopback address, as another machine has its own IP
                ip = {"node_ip_address": f"127.0.0.{index + 1}"} if index else {}
                cluster.add_node(num_cpus=num_cpus, include_dashboard=False, **ip)
            cluster.wait_for_nodes()
            break
        except Exception:  # noqa: BLE001 - Ray's start-up timeouts are bare Exceptions
            cluster.shutdown()
            if attempt == START_ATTEMPTS:
                raise
    try:
        yield cluster
    finally:
        cluster.shutdown()
