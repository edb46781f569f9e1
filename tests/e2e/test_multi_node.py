"""Several nodes on one machine: a local Ray cluster of two raylets (Ray's own `ray.cluster_utils.Cluster`), each a
"node" of one CPU slot, joined by the embedded run through `cluster.ray_address`. The placement group must put the
trainer on one node and the engine on the other; `placement.json` records which, and each trainer rank reports the
node its own process runs on."""

from __future__ import annotations

import json

import pytest

from tests.helpers.runs import main_py

pytestmark = pytest.mark.slow


@pytest.fixture
def two_raylets():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.mark.timeout(600)
def test_the_trainer_and_the_engine_run_on_different_nodes(two_raylets, tmp_path):
    run_dir = tmp_path / "run"
    proc = main_py(
        run_dir,
        f"cluster.ray_address={two_raylets.address}",
        "cluster.num_nodes=2",
        "cluster.num_gpus_per_node=1",  # one CPU slot a node: the trainer's and the engine's bundles must split
        "train.num_rollout=2",
        timeout=480,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    placement = json.loads((run_dir / "placement.json").read_text())
    raylets = {node.node_id for node in two_raylets.list_all_nodes()}
    assert set(placement["nodes"]) == raylets and len(raylets) == 2
    (rank,) = placement["actor"]
    ((engine,),) = placement["engines"]
    assert {rank["node"], engine["node"]} == {0, 1}  # the dry run's node numbers, one role on each
    assert rank["node_id"] != engine["node_id"] and rank["process_node_id"] == rank["node_id"]
    assert placement["nodes"][rank["node"]] == rank["node_id"]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["rollout/step"] for s in steps if "rollout/raw_reward" in s] == [0, 1]
