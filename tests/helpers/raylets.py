"""A local Ray cluster of several raylets on this machine (Ray's own `ray.cluster_utils.Cluster`): each raylet a
"node" with its own resources and, past the first, its own loopback IP (127.0.0.2, ...), for the multi-node tests."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

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


def spanning_run(address: str) -> list[str]:
    """Overrides of a colocated run on two raylets at `address`: a training rank on each node, one engine of TP 2 over
    both, tensor syncs."""
    return [
        f"cluster.ray_address={address}",
        "cluster.num_nodes=2",
        "cluster.host=0.0.0.0",
        "cluster.num_gpus_per_node=1",
        "cluster.actor.num_nodes=2",
        "cluster.colocate=true",
        "cluster.rollout.num_gpus_per_engine=2",
        "rollout.weight_sync.mode=tensor",
        "rollout.batch_size=16",
        "train.global_batch_size=64",
        "rollout.deterministic=false",
        "train.num_rollout=2",
    ]


def spanning_engine(run_dir: Path) -> tuple[dict, dict, dict]:
    """(placement.json, the engine's engines.json entry, its follower's) of a `spanning_run`, after checking the
    engine's two bundles are nodes 0 and 1 at different IPs and its URL (node rank 0's) is at the first node's IP."""
    placement = json.loads((run_dir / "placement.json").read_text())
    ((first, second),) = placement["engines"]
    assert (first["node"], second["node"]) == (0, 1) and first["node_ip"] != second["node_ip"]
    (engine,) = json.loads((run_dir / "engines.json").read_text())["engines"]
    (follower,) = engine["nodes"]
    assert engine["url"].startswith(f"http://{first['node_ip']}:")  # node rank 0 serves the API
    return placement, engine, follower


def logged_requests(log: str, mark: str) -> list[dict]:
    """The requests a fake server logged under `mark` (`MARK {json}` lines), in arrival order."""
    lines = Path(log).read_text().splitlines()
    return [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith(mark)]
