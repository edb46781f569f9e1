"""Several nodes on one machine: a local Ray cluster of two raylets (Ray's own `ray.cluster_utils.Cluster`), each a
"node" of one CPU slot, joined by a run through `cluster.ray_address`. The embedded run must put the trainer on one
node and the engine on the other; colocated, one fake-SGLang engine of TP 2 spans both nodes (a server per node, as
SGLang runs one) and takes the two training ranks' tensor syncs. `placement.json` records where each role is, and
each trainer rank reports the node its own process runs on."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from slime.engine import http_client
from tests.fakes.fake_sglang import REQUEST_MARK
from tests.fakes.fake_vllm import REQUEST_MARK as VLLM_REQUEST_MARK
from tests.helpers.fleet import running_fleet, wait_until
from tests.helpers.raylets import local_raylets, logged_requests, spanning_engine, spanning_run
from tests.helpers.runs import main_py

pytestmark = pytest.mark.slow


@pytest.fixture
def two_raylets():
    with local_raylets(2) as cluster:
        yield cluster


@pytest.mark.timeout(600)
def test_the_trainer_and_the_engine_run_on_different_nodes(two_raylets, tmp_path):
    run_dir = tmp_path / "run"
    proc = main_py(
        run_dir,
        f"cluster.ray_address={two_raylets.address}",
        "cluster.num_nodes=2",
        "cluster.host=0.0.0.0",
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
    # every raylet has its own IP (tests/helpers/raylets.py); the engine binds every interface and is reached at its
    # node's: that is the address the router was given
    ips = {node.node_id: node.node_ip_address for node in two_raylets.list_all_nodes()}
    assert engine["node_ip"] == ips[engine["node_id"]] != ips[rank["node_id"]] == rank["node_ip"]
    (served,) = json.loads((run_dir / "engines.json").read_text())["engines"]
    assert served["url"].startswith(f"http://{engine['node_ip']}:")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["rollout/step"] for s in steps if "rollout/raw_reward" in s] == [0, 1]


@pytest.mark.timeout(300)
def test_a_loopback_host_with_roles_off_the_drivers_node_stops_before_they_start(two_raylets, tmp_path):
    """cluster.num_nodes=1 passes validation, but Ray spreads the two bundles over both raylets: servers bound to
    127.0.0.1 on the other node could not be reached, so the run stops at placement (exit 2), naming the key."""
    run_dir = tmp_path / "run"
    proc = main_py(run_dir, f"cluster.ray_address={two_raylets.address}", timeout=240)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "cluster.host='127.0.0.1': Ray placed roles of this run on 1 node(s) other than the driver's" in proc.stderr
    assert "set cluster.host=0.0.0.0" in proc.stderr and "Traceback" not in proc.stderr
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "invalid_config" and result["phase"] == "startup"
    assert not (run_dir / "engines.json").exists() and not (run_dir / "placement.json").exists()


@pytest.mark.timeout(600)
def test_an_sglang_engine_spans_both_nodes_and_every_sync_reaches_it(two_raylets, tmp_path):
    run_dir = tmp_path / "run"
    proc = main_py(
        run_dir,
        "rollout=sglang",
        "rollout.sglang_launch.module=tests.fakes.fake_sglang",
        *spanning_run(two_raylets.address),
        timeout=480,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    placement, engine, follower = spanning_engine(run_dir)
    first, second = placement["engines"][0]
    assert [(r["node"], r["process_node_id"]) for r in placement["actor"]] == [
        (0, first["node_id"]),
        (1, second["node_id"]),
    ]
    assert Path(follower["log"]).name == "engine_0_node1.log" and follower["pid"] != engine["pid"]
    pushes = [r for r in logged_requests(engine["log"], REQUEST_MARK) if r["path"] == "/update_weights_from_tensor"]
    assert len(pushes) >= 3  # before rollout 0 and after each step, every TP rank's item taken in by node rank 0
    assert "node rank 0 is gone" in Path(follower["log"]).read_text()  # stopped with node rank 0


@pytest.mark.timeout(600)
def test_a_vllm_engine_spans_both_nodes_with_a_headless_follower(two_raylets, tmp_path):
    """vLLM's multi-node launch: node rank 0 serves, node rank 1 runs `serve --headless` (the fake's, through vLLM's
    own parser); both meet at --master-addr:--master-port on node rank 0's node, every sync goes to node rank 0."""
    run_dir = tmp_path / "run"
    proc = main_py(
        run_dir,
        "rollout=vllm",
        "rollout.vllm_launch.module=tests.fakes.fake_vllm",
        "rollout.vllm_launch.headless_module=tests.fakes.fake_vllm",
        *spanning_run(two_raylets.address),
        timeout=480,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    placement, engine, follower = spanning_engine(run_dir)
    first = placement["engines"][0][0]
    assert follower["url"] is None  # a headless node serves no HTTP
    follower_log = Path(follower["log"]).read_text()
    assert "--nnodes 2 --node-rank 1" in follower_log and "--headless" in follower_log
    assert "headless multiproc executor, with head node address " + first["node_ip"] in follower_log
    pushes = [r for r in logged_requests(engine["log"], VLLM_REQUEST_MARK) if r["path"] == "/update_weights"]
    assert len(pushes) >= 3  # before rollout 0 and after each step


@pytest.mark.timeout(600)
def test_a_spanning_engine_whose_follower_dies_is_restarted_whole(two_raylets, tiny_model_dir, tmp_path):
    """`rollout.fault_tolerance`: the other node's server dies (kill -9); the fleet finds the engine dead, restarts
    both nodes' servers (node rank 0 waits for the new follower at the same rendezvous) and it generates again."""
    overrides = [
        f"model.hf_checkpoint={tiny_model_dir}",
        "rollout=sglang",
        "rollout.sglang_launch.module=tests.fakes.fake_sglang",
        "rollout.fault_tolerance.enabled=true",
        *spanning_run(two_raylets.address),
    ]
    with running_fleet(overrides, tmp_path) as fleet:
        (slot,) = fleet.slots
        before = (slot.info["pid"], slot.info["nodes"][0]["pid"])
        os.kill(before[1], signal.SIGKILL)
        wait_until(lambda: fleet.find_dead() == [0], what="the engine found dead")
        assert fleet.recover() == [0]
        fleet.resume_memory(["weights", "kv_cache", "cuda_graph"])  # colocated: it came up released, as slime's do
        fleet.register_restarted([0])
        after = (slot.info["pid"], slot.info["nodes"][0]["pid"])
        assert after[0] != before[0] and after[1] != before[1] and slot.restarts == 1
        out = http_client.post(slot.url + "/generate", {"input_ids": [1, 5], "sampling_params": {"max_new_tokens": 2}})
        assert len(out["output_ids"]) == 2
        assert json.loads((tmp_path / "engines.json").read_text())["engines"][0]["nodes"][0]["pid"] == after[1]
