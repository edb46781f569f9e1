"""The vLLM engine adapter against the fake vLLM 0.32.0 server (tests/fakes/fake_vllm.py: vLLM's own parser,
routes, request and response types around the hf engine), launched through the same path as vLLM (`python -m
<module>` with vLLM's CLI), behind the real vllm-router: command line and environment, health wait,
registration (regular, PD, external router), token-level generation recorded on a Sample, every control call,
the three weight-sync modes, sleep/wake order and the error paths.

The servers here are what a CPU vLLM cannot be: each fixture server runs with --enable-sleep-mode (a CPU vLLM
refuses it) and a weight-transfer backend whose engine needs an accelerator (NCCL, CUDA IPC), and a PD pair
would need NIXL's KV transfer. Each test says which of these it needs; what a real CPU vLLM can do (plain
generation, abort, pause/resume, disk sync, engines.json, kill -9) tests/e2e/test_vllm_real.py covers on the real
server, so those tests may be trimmed here later.

Two fake servers start once for the module, in parallel (see the `servers` fixture)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time

import aiohttp
import pytest
import torch

from slime.config.schema import RolloutConfig, RouterConfig, WeightSyncConfig
from slime.engine import http_client
from slime.engine.base import EngineLaunch, EngineStartupError, LoRAServing, get_engine_class
from slime.engine.router import RouterError
from slime.engine.vllm.client import VLLMClient
from slime.engine.vllm.engine import VLLMEngine, VLLMEngineConfig
from slime.engine.vllm.router import VLLMRouter
from slime.rollout.base import RolloutContext
from slime.rollout.generate import generate
from slime.run_schema import schema_class
from slime.sync.base import SyncContext
from slime.types import Sample, SampleStatus
from tests.fakes.fake_vllm import GENERATE_MARK, REQUEST_MARK
from tests.helpers.processes import in_thread, joined
from tests.helpers.vllm_real import parsed_by_vllm

FAKE = "tests.fakes.fake_vllm"


def make_engine(model_dir, log_dir, *, rank=0, gpu_ids=(), device="cpu", memory_saver=False, timeout_s=120.0, **config):
    launch = EngineLaunch(
        rank=rank,
        model_path=str(model_dir),
        host="127.0.0.1",
        seed=11 + rank,
        device=device,
        log_dir=str(log_dir),
        gpu_ids=tuple(gpu_ids),
        startup_timeout_s=timeout_s,
        shutdown_grace_s=5,
        memory_saver=memory_saver,
    )
    return VLLMEngine(launch, VLLMEngineConfig(**{"args": {}, "launch_module": FAKE, **config}))


def logged(engine, mark=REQUEST_MARK) -> list[dict]:
    lines = engine.log_path.read_text().splitlines()
    return [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith(mark)]


def test_registered_and_command_is_vllms_cli_with_the_framework_owned_arguments(tmp_path):
    assert get_engine_class("vllm") is VLLMEngine
    engine = make_engine("/models/qwen", tmp_path, gpu_ids=("3", "5"), device="cuda", memory_saver=True)
    engine.config = VLLMEngineConfig(
        args={"gpu_memory_utilization": 0.7, "max_model_len": 2048, "prefill_num_servers": 1},
        launch_module="vllm.entrypoints.launchers.api_server.entry",
        worker_type="prefill",
        weight_transfer_backend="ipc",
    )
    cmd = engine.command([15001, 15002])
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry"]
    args = parsed_by_vllm(cmd[3:])  # the installed vLLM 0.32.0's own parser accepts all of it
    expected = {
        "model": "/models/qwen",
        "host": "127.0.0.1",
        "port": 15001,
        "tensor_parallel_size": 2,
        "seed": 11,
        "enable_sleep_mode": True,
        "distributed_executor_backend": "mp",
        "logprobs_mode": "processed_logprobs",
        "gpu_memory_utilization": 0.7,
        "max_model_len": 2048,
        "enable_server_load_tracking": True,
        "enable_scale_out": True,
        "weight_transfer_config": {"backend": "ipc"},
    }
    assert {k: args[k] for k in expected} == expected
    kv = args["kv_transfer_config"]  # vLLM's KVTransferConfig, its defaults filled in
    assert (kv["kv_connector"], kv["kv_role"]) == ("NixlConnector", "kv_both")
    assert "--prefill-num-servers" not in cmd  # the framework's key, not vLLM's
    engine.lease = type("Lease", (), {"ports": [15001, 15002]})()
    env = engine.env()
    assert env["CUDA_VISIBLE_DEVICES"] == "3,5" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1" and env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "15002"
    assert "PYTORCH_CUDA_ALLOC_CONF" in VLLMEngine.unset_env
    rollout = schema_class("rollout")(
        engine="vllm", vllm={"enforce_eager": True}, weight_sync=WeightSyncConfig(mode="distributed")
    )
    config = VLLMEngine.config_from(rollout, worker_type="decode", overrides={"max_num_seqs": 8})
    assert config.args == {"enforce_eager": True, "max_num_seqs": 8} and config.weight_transfer_backend == "nccl"
    with pytest.raises(ValueError, match=r"\['tensor_parallel_size'\] are set by the framework"):
        make_engine("/m", tmp_path, args={"tensor_parallel_size": 4}).command([1, 2])


def test_a_server_that_rejects_its_arguments_fails_with_the_log_tail(tmp_path):
    """vLLM's own parser refuses the flag inside the fake as it would in vLLM; tests/e2e/test_vllm_real.py covers the
    real server."""
    engine = make_engine("/m", tmp_path, args={"no_such_engine_arg": 1})
    with pytest.raises(EngineStartupError, match=r"(?s)exited with status 2.*unrecognized arguments: --no-such"):
        engine.start()
    assert engine.process is None


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    """(main, prefill): two fake vLLM servers started by the adapter, in parallel. `main` is a PD decode server
    of TP 2 on two "GPUs" with sleep mode and the NCCL transfer backend (it also serves as a regular worker);
    `prefill` a PD prefill server with the IPC transfer backend."""
    logs = tmp_path_factory.mktemp("vllm_logs")
    main = make_engine(tiny_model_dir, logs, gpu_ids=("0", "1"), memory_saver=True, worker_type="decode")
    prefill = make_engine(tiny_model_dir, logs, rank=1, worker_type="prefill", weight_transfer_backend="ipc")
    engines = [main, prefill]
    try:
        for engine in engines:
            engine.launch()
        for engine in engines:
            engine.wait_until_ready()
        yield main, prefill
    finally:
        for engine in engines:
            engine.shutdown()


@pytest.fixture(scope="module")
def router(servers, tmp_path_factory):
    router = VLLMRouter.launch(cfg=RouterConfig(), log_path=tmp_path_factory.mktemp("router") / "router.log")
    router.add_worker(servers[0].url)
    yield router
    router.shutdown()


def rollout_context(router_url: str, tiny_model_dir: str, session) -> RolloutContext:
    from transformers import AutoTokenizer

    return RolloutContext(
        config=RolloutConfig(engine="vllm"),
        router_url=router_url,
        tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir),
        batch_size=1,
        over_sampling_batch_size=1,
        sampling_params={},
        max_in_flight=4,
        rewards=None,
        session=session,
        sampling_seed=5,
    )


def generate_sample(router_url: str, tiny_model_dir: str, params: dict, tokens=(1, 5, 11)) -> Sample:
    async def run():
        async with aiohttp.ClientSession() as session:
            sample = Sample(index=0, prompt="", tokens=list(tokens), response_length=0)
            return await generate(rollout_context(router_url, tiny_model_dir, session), sample, params)

    return asyncio.run(run())


GREEDY = {"max_new_tokens": 6, "ignore_eos": True, "temperature": 0.0, "top_k": -1}


def test_generation_through_the_router_is_recorded_on_the_sample_as_with_sglang(servers, router, tiny_model_dir):
    """Plain generation, which tests/e2e/test_vllm_real.py covers on the real server; here on the fixture's TP-2
    sleep-mode server (a CPU vLLM refuses --enable-sleep-mode)."""
    regular = servers[0]
    assert [(w["url"], w["worker_type"], w["is_healthy"]) for w in router.list_workers()] == [
        (regular.url, "regular", True)
    ]
    sample = generate_sample(router.url, tiny_model_dir, GREEDY)
    assert sample.response_length == 6 and len(sample.tokens) == 9 and len(sample.rollout_log_probs) == 6
    assert all(lp <= 0 for lp in sample.rollout_log_probs) and sample.loss_mask == [1] * 6
    assert sample.status == SampleStatus.TRUNCATED and sample.weight_versions == ["default"]  # vLLM's first
    (call,) = [g for g in logged(regular, GENERATE_MARK)][-1:]
    assert call["max_tokens"] == 6  # max_new_tokens became vLLM's max_tokens
    again = generate_sample(router.url, tiny_model_dir, GREEDY)
    assert again.tokens == sample.tokens and again.rollout_log_probs == sample.rollout_log_probs  # greedy
    info = regular.client.server_info()
    assert info["tp_size"] == 2 and info["fake_cli"]["enable_sleep_mode"] is True


def test_control_calls_and_the_colocated_sleep_wake_order(servers, router, tiny_model_dir):
    """The colocated hand-off (docs/architecture.md#colocated-hand-off) with vLLM's levels: sleep (all) -> wake weights
    -> write weights -> wake kv_cache. A generation sent while asleep waits (vLLM's EngineCore queues it while its
    scheduler is paused) and runs with the new weights once every tag is awake; a weight write into slept weights fails,
    as on a GPU. Fake only: sleep level 2 needs --enable-sleep-mode, which a CPU vLLM refuses."""
    regular = servers[0]
    client = regular.client
    before = len(logged(regular))
    client.pause_generation()
    client.flush_cache()
    client.continue_generation()
    client.abort_all_and_wait_idle(timeout_s=10)
    client.release_memory()
    assert client.is_sleeping()
    waiting, box = in_thread(lambda: generate_sample(router.url, tiny_model_dir, GREEDY))
    with pytest.raises(http_client.EngineHTTPError, match="weights are asleep"):
        client.update_weights_from_disk(tiny_model_dir, weight_version="5")
    client.resume_memory(["weights"])
    client.update_weights_from_disk(tiny_model_dir, weight_version="5")
    assert client.is_sleeping() and waiting.is_alive()  # the KV cache still sleeps: nothing is scheduled
    client.resume_memory(["kv_cache", "cuda_graph"])
    sample = joined(waiting, box, timeout_s=60)
    assert not client.is_sleeping() and client.get_weight_version() == "5"
    assert sample.weight_versions == ["5"] and sample.response_length == 6
    calls = [(r["path"], r["query"]) for r in logged(regular)[before:]]
    assert calls == [
        ("/pause", "mode=abort"),
        ("/reset_prefix_cache", ""),
        ("/resume", ""),
        ("/abort_requests", ""),
        ("/sleep", "level=2"),
        ("/collective_rpc", ""),  # refused: weights asleep
        ("/wake_up", "tags=weights"),
        ("/collective_rpc", ""),
        ("/update_weight_version", ""),
        ("/wake_up", "tags=kv_cache"),
    ]
    assert generate_sample(router.url, tiny_model_dir, GREEDY).weight_versions == ["5"]


def _buckets(tiny_model_dir: str, scale: float) -> list[list[tuple[str, torch.Tensor]]]:
    from slime.engine.hf.weights import read_safetensors_dir

    tensors = read_safetensors_dir(tiny_model_dir)
    names = sorted(tensors)
    half = len(names) // 2
    return [[(n, tensors[n] * scale) for n in part] for part in (names[:half], names[half:])]


@pytest.mark.parametrize("mode", ["distributed", "tensor", "disk"])
def test_weight_sync_modes_land_the_trainers_weights(servers, tiny_model_dir, tmp_path, mode):
    """A push of scaled weights changes the engine's greedy output; pushing the originals back restores it
    bit for bit, and the version is the push's. distributed -> the main server's NCCL backend (gloo here, all
    its TP ranks join), tensor -> the prefill server's IPC backend (/dev/shm), disk -> /collective_rpc. Fake
    only for distributed and tensor: a CPU vLLM's NCCL and IPC transfer engines need an accelerator; the disk
    sync tests/e2e/test_vllm_real.py covers on the real server."""
    from slime.registry import WEIGHT_SYNC

    engine = servers[1] if mode == "tensor" else servers[0]
    client = VLLMClient(engine.url)
    context = SyncContext(source_checkpoint=tiny_model_dir, engine="vllm", work_dir=str(tmp_path), bucket_bytes=1 << 20)
    reference = generate_sample(engine.url, tiny_model_dir, GREEDY)
    before = len(logged(engine))
    sync = WEIGHT_SYNC.load(mode)([client], context)
    try:
        sync.push(_buckets(tiny_model_dir, 0.5), weight_version=7)
        changed = generate_sample(engine.url, tiny_model_dir, GREEDY)
        sync.push(_buckets(tiny_model_dir, 1.0), weight_version=8)
    finally:
        sync.close()
    restored = generate_sample(engine.url, tiny_model_dir, GREEDY)
    assert changed.weight_versions == ["7"] and changed.rollout_log_probs != reference.rollout_log_probs
    assert restored.weight_versions == ["8"] and restored.rollout_log_probs == reference.rollout_log_probs
    paths = [r["path"] for r in logged(engine)[before:]]
    one_push = {
        "distributed": ["/start_weight_update", "/update_weights", "/update_weights", "/finish_weight_update"],
        "tensor": ["/start_weight_update", "/update_weights", "/update_weights", "/finish_weight_update"],
        "disk": ["/collective_rpc", "/update_weight_version"],
    }[mode]
    bracket = ["/pause", "/reset_prefix_cache", *one_push, "/resume"]
    setup = {"distributed": ["/init_weight_transfer_engine"], "tensor": [], "disk": []}[mode]
    teardown = ["/shutdown_weight_transfer_engine"] if mode == "distributed" else []
    first_init = ["/init_weight_transfer_engine"] if mode == "tensor" else []
    expected = setup + bracket[:3] + first_init + bracket[3:] + bracket + teardown
    assert paths == expected
    if mode == "tensor":
        update = next(r for r in logged(engine)[before:] if r["path"] == "/update_weights")
        assert set(update["body"]["update_info"]) == {"names", "dtype_names", "shapes", "tensor_sizes"}


def test_verified_pushes_compare_vllms_digests_in_its_layout(servers, tiny_model_dir, tmp_path, monkeypatch, caplog):
    """`rollout.weight_sync.verify` through vLLM's /weight_checker: on the one-worker server a clean tensor push
    matches in vLLM's layout (fused q/k/v and gate/up, the embedding padded to 64 rows) and a flipped byte is named
    with the fused parameter it belongs to; the two-worker server holds shards, which the trainer does not compare
    (logged)."""
    import logging

    from slime.registry import WEIGHT_SYNC
    from slime.sync.base import WeightMismatchError
    from tests.helpers.planted_faults import planted

    context = SyncContext(
        source_checkpoint=tiny_model_dir, engine="vllm", work_dir=str(tmp_path), bucket_bytes=1 << 20, verify=True
    )
    prefill = WEIGHT_SYNC.load("tensor")([VLLMClient(servers[1].url)], context)
    main = WEIGHT_SYNC.load("distributed")([VLLMClient(servers[0].url)], context)
    qkv = r"model\.layers\.1\.self_attn\.qkv_proj\.weight = \S+q_proj\.weight \+ \S+k_proj\.weight \+ \S+v_proj\.weight"
    try:
        assert prefill.push(_buckets(tiny_model_dir, 0.5), weight_version=7)["perf/update_weights_verify_time"] > 0
        with planted(monkeypatch, flip="model.layers.1.self_attn.k_proj.weight"):
            with pytest.raises(WeightMismatchError, match=rf"version 8: {qkv} \(bucket \d of 2"):
                prefill.push(_buckets(tiny_model_dir, 1.0), weight_version=8)
        prefill.push(_buckets(tiny_model_dir, 1.0), weight_version=9)
        with caplog.at_level(logging.INFO, logger="slime.sync.verify"):
            main.push(_buckets(tiny_model_dir, 1.0), weight_version=9)
        assert "verified against the other engines only: its weights are in 2 shards" in caplog.text
        # vLLM's own reset and compare (`zero_weights`; a baseline the caller keeps): every parameter differs, until
        # the same weights are pushed again
        checker = servers[1].url + "/weight_checker"
        baseline = http_client.post(checker, {"action": "checksum"})["checksums"]
        assert http_client.post(checker, {"action": "reset"}) == {"status": "reset"}
        reset = http_client.post(checker, {"action": "compare", "baseline": baseline})
        assert reset == {"match": False, "mismatches": sorted(baseline)}
        prefill.push(_buckets(tiny_model_dir, 1.0), weight_version=10)
        assert http_client.post(checker, {"action": "compare", "baseline": baseline}) == {
            "match": True,
            "mismatches": [],
        }
    finally:
        prefill.close()
        main.close()


def test_pd_servers_register_with_a_pd_router_and_decode_receives_the_prefills_kv(servers, tiny_model_dir, tmp_path):
    """Fake only: PD disaggregation moves the KV cache over NIXL (`--kv-transfer-config` NixlConnector), which a
    CPU vLLM cannot (the fake passes the prefill's `kv_transfer_params` on and recomputes the prompt)."""
    decode, prefill = servers
    router = VLLMRouter.launch(cfg=RouterConfig(), log_path=tmp_path / "pd_router.log", pd=True)
    try:
        assert router.process is None and router.list_workers() == []  # vllm-router needs both kinds to start
        router.add_worker(prefill.url, worker_type="prefill")
        router.add_worker(decode.url, worker_type="decode")
        assert sorted((w["url"], w["worker_type"]) for w in router.list_workers()) == sorted(
            [(prefill.url, "prefill"), (decode.url, "decode")]
        )
        assert "--vllm-pd-disaggregation" in router.log_path.read_text()
        sample = generate_sample(router.url, tiny_model_dir, GREEDY)
        assert sample.response_length == 6 and sample.status == SampleStatus.TRUNCATED
        first = logged(prefill, GENERATE_MARK)[-1]
        second = logged(decode, GENERATE_MARK)[-1]
        assert first["max_tokens"] == 1 and first["kv_transfer_params"]["do_remote_decode"] is True
        assert second["max_tokens"] == 6 and second["kv_transfer_params"]["do_remote_prefill"] is True
        assert second["kv_transfer_params"]["remote_port"] == prefill.lease.ports[1]  # the NIXL side channel
        assert router.remove_worker(decode.url) and [w["url"] for w in router.list_workers()] == [prefill.url]
        router.add_worker(decode.url, worker_type="decode")  # a restarted decode server comes back
        assert len(router.list_workers()) == 2
        with pytest.raises(RouterError, match="already registered"):
            router.add_worker(prefill.url, worker_type="prefill")
    finally:
        router.shutdown()


def test_an_external_router_gets_the_workers_and_is_left_running(servers, tiny_model_dir, tmp_path):
    """Plain generation through a connected router, which tests/e2e/test_vllm_real.py covers on the real server;
    here on the fixture's sleep-mode server (a CPU vLLM refuses --enable-sleep-mode)."""
    regular = servers[0]
    external = VLLMRouter.launch(cfg=RouterConfig(policy="round_robin"), log_path=tmp_path / "external.log")
    try:
        joined = VLLMRouter.connect(external.url.removeprefix("http://"))
        joined.add_worker(regular.url)
        assert [w["url"] for w in external.list_workers()] == [regular.url]
        assert generate_sample(joined.url, tiny_model_dir, GREEDY).response_length == 6
        assert joined.remove_worker(regular.url) and external.list_workers() == []
        joined.shutdown()
        assert external.process.poll() is None  # a connected router is never stopped
    finally:
        external.shutdown()
    with pytest.raises(Exception, match="does not answer"):
        VLLMRouter.connect(external.url)


class LocalActor:
    """An engine as the fleet sees its Ray actor (`actor.method.remote(...)`), called in this process."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        method = getattr(self.engine, name)
        return type("Method", (), {"remote": staticmethod(method)})


def test_fault_tolerance_removes_a_crashed_engine_restarts_it_and_registers_it_again(
    servers, router, tiny_model_dir, tmp_path, monkeypatch
):
    """The fleet's fault tolerance (slime.rollout.manager.engine_fleet, Ray calls run locally) with a vLLM server
    (last: it kills the regular server): the health monitor removes it from the vllm-router, `recover()`
    restarts it on fresh ports, it gets the weights, then `register_restarted` puts it back. Kill and restart
    with engines.json are what tests/e2e/test_vllm_real.py covers on the real server; here on the fixture's
    sleep-mode server (a CPU vLLM refuses --enable-sleep-mode)."""
    from slime.config.schema import FaultToleranceConfig
    from slime.engine import fleet_setup
    from slime.engine.groups import EngineSpec, ModelSpec
    from slime.rollout.manager import engine_fleet

    monkeypatch.setattr(engine_fleet.ray, "get", lambda refs: refs)
    monkeypatch.setattr(engine_fleet.ray, "wait", lambda refs, num_returns: (refs[:num_returns], refs[num_returns:]))
    regular = servers[0]
    router.remove_worker(regular.url)
    ft = FaultToleranceConfig(enabled=True, health_check_interval_s=0.1, health_check_timeout_s=2.0)
    spec = EngineSpec(model="default", worker_type="regular", num_gpus=2, overrides={}, key="cluster")
    setup = fleet_setup.FleetSetup(
        rollout=schema_class("rollout")(engine="vllm", fault_tolerance=ft),
        models=[ModelSpec(name="default", model_path=tiny_model_dir, update_weights=True, router=RouterConfig())],
        specs=[spec],
        host="127.0.0.1",
        device="cpu",
        colocate=False,
        seed=1,
        run_dir=str(tmp_path),
        trainer_gpus=1,
    )
    fleet = engine_fleet.EngineFleet(setup, placements=[None])
    fleet.slots = [engine_fleet.EngineSlot(rank=0, spec=spec, actor=LocalActor(regular))]
    fleet.routers = {"default": router}
    fleet.finish_start()
    try:
        assert [w["url"] for w in router.list_workers()] == [regular.url]
        assert [type(c).__name__ for c in fleet.clients()] == ["VLLMClient"]
        old_pid = regular.pid
        regular.process.kill()
        for _ in range(200):  # the monitor marks the rank dead, then removes it from the router
            if fleet.dead_ranks() and not router.list_workers():
                break
            time.sleep(0.05)
        assert fleet.dead_ranks() == [0] and router.list_workers() == []  # removed from the router
        assert fleet.recover() == [0]
        regular.client.update_weights_from_disk(tiny_model_dir, weight_version="9")
        fleet.register_restarted([0])
        assert [w["url"] for w in router.list_workers()] == [regular.url] and regular.pid != old_pid
        assert generate_sample(router.url, tiny_model_dir, GREEDY).weight_versions == ["9"]
        (entry,) = json.loads((tmp_path / "engines.json").read_text())["engines"]
        assert entry["restarts"] == 1 and entry["pid"] == regular.pid and entry["kind"] == "vllm"
    finally:
        fleet._monitor_stop.set()


def test_an_adapter_sync_starts_the_server_with_runtime_lora_loading(tmp_path):
    """model.lora synced alone: vLLM's parser reads LoRA on, one adapter, its rank rounded up to one vLLM takes, and the
    environment mounts the runtime LoRA routes."""
    engine = make_engine("/models/qwen", tmp_path)
    engine.launch_spec = dataclasses.replace(
        engine.launch_spec, lora=LoRAServing(max_rank=4, target_modules=("q_proj",))
    )
    args = parsed_by_vllm(engine.command([15001])[3:])
    assert {k: args[k] for k in ("enable_lora", "max_lora_rank", "max_loras")} == {
        "enable_lora": True,
        "max_lora_rank": 8,
        "max_loras": 1,
    }
    assert engine.env()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in make_engine("/models/qwen", tmp_path).env()


def test_an_engine_spanning_two_nodes_is_vllms_multi_node_launch(tiny_model_dir, tmp_path):
    """`EngineLaunch.node_slice`: every node's server gets vLLM's --nnodes / --node-rank / --master-addr /
    --master-port and the tp of every node's GPUs; node rank 1 runs vLLM's CLI (`serve --headless`: its API server
    entry would ignore the flag). Run with the fake: node rank 0 is not ready before node rank 1 joined the
    rendezvous, the headless node serves no HTTP and stops once node rank 0 has gone."""
    import importlib.util

    from slime.engine.base import NodeSlice
    from slime.net import free_port, unreachable

    assert importlib.util.find_spec("vllm.entrypoints.cli.main") is not None
    from vllm.entrypoints.cli.serve import run_headless  # noqa: F401 - what `serve --headless` runs (0.32.0)

    address = f"127.0.0.1:{free_port()}"

    def node(rank, **config):
        engine = make_engine(tiny_model_dir, tmp_path, rank=3, gpu_ids=("0", "1"), **config)
        span = NodeSlice(num_nodes=2, node_rank=rank, dist_init_addr=address)
        return VLLMEngine(dataclasses.replace(engine.launch_spec, node_slice=span), engine.config)

    real = node(1, launch_module="vllm.entrypoints.launchers.api_server.entry")
    cmd = real.command([15001, 15002])
    assert cmd[:4] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    args = parsed_by_vllm(cmd[4:])  # vLLM 0.32.0's serve parser
    spans = ("nnodes", "node_rank", "master_addr", "master_port", "headless", "tensor_parallel_size")
    assert tuple(args[k] for k in spans) == (2, 1, "127.0.0.1", int(address.split(":")[1]), True, 4)
    assert not parsed_by_vllm(node(0).command([15001, 15002])[3:])["headless"]

    first, second = node(0), node(1, headless_module=FAKE)
    first.launch()
    try:
        time.sleep(8)  # long enough for the fake alone to have been ready
        assert not first.client.is_healthy(first.health_path, timeout=2.0)  # waiting for node rank 1
        second.start()
        first.wait_until_ready()
        assert second.describe()["url"] is None and second.is_running()
        assert unreachable("127.0.0.1", second.lease.ports[0], 2.0) is not None  # no HTTP on a headless node
        body = {"token_ids": [1, 5], "sampling_params": {"max_tokens": 2}}
        (choice,) = http_client.post(first.url + "/inference/v1/generate", body)["choices"]
        assert len(choice["token_ids"]) == 2
        first.shutdown()
        deadline = time.monotonic() + 30
        while second.is_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not second.is_running()
        assert "node rank 0 is gone: node rank 1 stops" in second.log_path.read_text()
        assert (first.log_path.name, second.log_path.name) == ("engine_3.log", "engine_3_node1.log")
    finally:
        first.shutdown()
        second.shutdown()
