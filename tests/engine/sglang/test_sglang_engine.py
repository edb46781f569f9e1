"""The SGLang engine adapter against the fake SGLang server (tests/fakes/fake_sglang.py), launched through
the same path as SGLang (`python -m <module>` with SGLang's CLI): command line, environment, health wait,
router registration with the real sglang-router, every control call, and the error paths."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from slime.engine import http_client
from slime.engine.base import EngineStartupError, LoRAServing, NodeSlice, get_engine_class
from slime.engine.router import Router
from slime.engine.sglang.engine import SGLangEngine
from slime.models.moe.routes import decode_routes
from slime.net import free_port
from tests.fakes.fake_sglang import GENERATE_MARK
from tests.helpers.fake_sglang_engine import make_engine, requests_logged
from tests.helpers.moe_rollout import tiny_moe, wire_generate
from tests.helpers.sglang_probe import SGLangProbe


def test_registered_as_rollout_engine_sglang():
    assert get_engine_class("sglang") is SGLangEngine


@pytest.fixture(scope="module")
def sglang_parser():
    """SGLang 0.5.23's own parser (ServerArgs.add_cli_args) in a probe process: argv -> its namespace."""
    probe = SGLangProbe.start()

    def parse(argv: list[str]) -> dict:
        answer = probe.parse_cli(argv)
        assert answer["parse_error"] is None, f"SGLang's parser refuses {argv}: {answer['parse_error']}"
        return answer["namespace"]

    yield parse
    probe.close()


def test_command_is_sglangs_cli_with_the_framework_owned_fields(tmp_path, sglang_parser):
    engine = make_engine(
        "/models/qwen",
        tmp_path,
        gpu_ids=("3", "5"),
        device="cuda",
        memory_saver=True,
        launch_module="sglang.launch_server",
        deterministic=True,
        server_args={"mem_fraction_static": 0.7, "context_length": 2048, "disable_radix_cache": True},
    )
    cmd = engine.command([15001, 15002, 15003])
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    args = sglang_parser(cmd[3:])  # SGLang's own parser accepts all of it
    expected = {
        "model_path": "/models/qwen",
        "host": "127.0.0.1",
        "port": 15001,
        "nccl_port": 15002,
        "tp_size": 2,  # two GPUs, pp 1
        "base_gpu_id": 0,  # CUDA_VISIBLE_DEVICES holds the engine's own GPUs
        "gpu_id_step": 1,
        "random_seed": 11,
        "skip_server_warmup": True,
        "enable_metrics": True,
        "enable_memory_saver": True,
        "enable_deterministic_inference": True,
        "weight_version": "0",
        "trust_remote_code": True,
        "cuda_graph_backend_prefill": "disabled",  # colocated: the memory saver cannot release breakable graphs
        "mem_fraction_static": 0.7,
        "context_length": 2048,
        "disable_radix_cache": True,
        "disaggregation_mode": "null",
        "device": None,  # SGLang picks cuda itself
    }
    assert {k: args[k] for k in expected} == expected
    env = engine.env()
    assert env["CUDA_VISIBLE_DEVICES"] == "3,5" and env["NCCL_CUMEM_ENABLE"] == "0"
    assert {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"} <= set(SGLangEngine.unset_env)


def test_prefill_server_gets_disaggregation_mode_and_bootstrap_port(tmp_path, sglang_parser):
    engine = make_engine("/m", tmp_path, worker_type="prefill", server_args={"pp_size": 2}, gpu_ids=("0", "1"))
    args = sglang_parser(engine.command([1, 2, 3])[3:])
    assert (args["disaggregation_mode"], args["disaggregation_bootstrap_port"], args["tp_size"]) == ("prefill", 3, 1)


def test_routing_replay_starts_the_server_returning_each_tokens_experts(tmp_path, sglang_parser):
    """algo.routing_replay=rollout: SGLang's parser reads --enable-return-routed-experts, and the fake server (the hf
    engine under SGLang's routes and request types) answers return_routed_experts with one row per fed token."""
    moe = tiny_moe(tmp_path / "models")
    engine = make_engine(moe.hf_checkpoint, tmp_path, routes=True)
    assert sglang_parser(engine.command([1, 2, 3])[3:])["enable_return_routed_experts"] is True
    assert sglang_parser(make_engine("/m", tmp_path).command([1, 2, 3])[3:])["enable_return_routed_experts"] is False
    engine.start()
    try:
        params = {"max_new_tokens": 5, "ignore_eos": True, "temperature": 0}
        body = {"input_ids": [1, 5, 11, 7], "sampling_params": params, "return_routed_experts": True}
        out = http_client.post(engine.url + "/generate", body)
        routes = decode_routes(out["meta_info"]["routed_experts"], num_tokens=4 + 5, num_layers=2, topk=2)
        assert routes.shape == (8, 2, 2) and set(routes.ravel()) <= {0, 1, 2, 3}
        # state_capturer/base.py:get_topk: rows from routed_experts_start_len on; a negative one is refused
        later = http_client.post(engine.url + "/generate", {**body, "routed_experts_start_len": 3})["meta_info"]
        tail = decode_routes(later["routed_experts"], num_tokens=4 + 5, num_layers=2, topk=2, start_len=3)
        assert (tail == routes[3:]).all()
        with pytest.raises(http_client.EngineHTTPError, match="must be non-negative"):
            http_client.post(engine.url + "/generate", {**body, "routed_experts_start_len": -1})
        not_asked = {k: v for k, v in body.items() if k != "return_routed_experts"}
        assert "routed_experts" not in http_client.post(engine.url + "/generate", not_asked)["meta_info"]
    finally:
        engine.shutdown()


def test_a_server_without_the_flag_returns_no_routes_even_when_asked(tmp_path):
    """SGLang's capturer exists only with --enable-return-routed-experts
    (state_capturer/routed_experts.py:RoutedExpertsCapturer.create), so meta_info carries no routes without it."""
    import torch

    moe = tiny_moe(tmp_path / "models")
    body = {"input_ids": [1, 5, 11], "sampling_params": {"max_new_tokens": 2}, "return_routed_experts": True}
    out = wire_generate(moe.hf_checkpoint, body, dtype=torch.float32, capture_routes=False)
    assert "routed_experts" not in out["meta_info"] and len(out["output_ids"]) == 2


def test_framework_owned_fields_are_refused(tmp_path):
    engine = make_engine("/m", tmp_path, server_args={"tp_size": 4})
    with pytest.raises(ValueError, match=r"\['tp_size'\] are set by the framework"):
        engine.command([1, 2, 3])


@pytest.fixture(scope="module")
def started(tiny_model_dir, tmp_path_factory):
    """A fake SGLang server started by the adapter (tp 2 on two 'GPUs'), registered with a real router."""
    logs = tmp_path_factory.mktemp("sglang_logs")
    engine = make_engine(tiny_model_dir, logs, gpu_ids=("0", "1"), server_args={"mem_fraction_static": 0.6})
    from slime.config.schema import RouterConfig

    router = Router.launch(cfg=RouterConfig(), log_path=logs / "router.log")
    engine.start()
    router.add_worker(engine.url)
    yield engine, router
    router.shutdown()
    engine.shutdown()


def test_started_server_reports_its_server_args_and_generates_behind_the_router(started):
    engine, router = started
    info = engine.client.server_info()
    assert (info["tp_size"], info["random_seed"], info["mem_fraction_static"], info["skip_server_warmup"]) == (
        2,
        11,
        0.6,
        True,
    )
    assert info["port"] == engine.lease.ports[0] and info["nccl_port"] == engine.lease.ports[1]
    assert [w["url"] for w in router.list_workers()] == [engine.url]
    out = http_client.post(
        router.url + "/generate",
        {"input_ids": [1, 5, 11], "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}, "return_logprob": True},
    )
    assert len(out["meta_info"]["output_token_logprobs"]) == 5 and out["meta_info"]["weight_version"] == "0"
    assert engine.describe()["pid"] == engine.process.pid and engine.describe()["url"] == engine.url


def test_every_control_call_reaches_the_server_in_order(started, tiny_model_dir):
    engine, _ = started
    client = engine.client
    before = len(requests_logged(engine))
    client.pause_generation()
    client.flush_cache()
    client.continue_generation()
    client.abort_all_and_wait_idle(timeout_s=10)
    client.release_memory()
    assert engine.client.server_info()["internal_states"][0]["released_tags"] == ["cuda_graph", "kv_cache", "weights"]
    client.resume_memory(["weights"])
    client.update_weights_from_disk(tiny_model_dir, weight_version="7")
    client.resume_memory(["kv_cache", "cuda_graph"])
    assert engine.client.server_info()["internal_states"][0]["released_tags"] == []
    calls = [(r["path"], r["body"]) for r in requests_logged(engine)[before:]]
    assert calls == [
        ("/pause_generation", {}),
        ("/flush_cache", None),
        ("/continue_generation", {}),
        ("/abort_request", {"abort_all": True}),
        ("/release_memory_occupation", {}),
        ("/resume_memory_occupation", {"tags": ["weights"]}),
        ("/update_weights_from_disk", {"model_path": tiny_model_dir, "flush_cache": True, "weight_version": "7"}),
        ("/resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]}),
    ]
    assert client.get_weight_version() == "7"


def test_the_fakes_memory_section_is_sglangs_filled_with_the_models_weights(started, tiny_model_dir):
    """The fake fills SGLang's MemoryMetrics as scheduler_components/load_inquirer.py does (GiB rounded to 3 places,
    the token capacity an int): its model's weights, no KV pool, no graphs; a core-only read carries no section."""
    engine, _ = started
    checkpoint = sum(t.nbytes for f in Path(tiny_model_dir).glob("*.safetensors") for t in load_file(f).values())
    (rank,) = http_client.get(engine.url + "/v1/loads?include=memory")["loads"]
    weight = round((checkpoint + 64) / 2**30, 3)  # and the rotary table's 64 bytes
    assert rank["memory"] == {"weight_gb": weight, "kv_cache_gb": 0.0, "graph_gb": 0.0, "token_capacity": 512}
    assert engine.client.memory_gib() == {"weight": weight, "kv_cache": 0.0, "graph": 0.0}
    assert "memory" not in engine.client.loads()["loads"][0]


def test_a_server_that_rejects_its_arguments_fails_with_the_log_tail(tmp_path):
    engine = make_engine("/m", tmp_path, server_args={"no_such_server_arg": 1})
    with pytest.raises(
        EngineStartupError, match=r"(?s)exited with status 2.*unrecognized arguments: --no-such-server-arg"
    ):
        engine.start()
    assert engine.process is None


def test_a_server_that_is_not_healthy_in_time_fails_naming_the_timeout(tiny_model_dir, tmp_path):
    engine = make_engine(tiny_model_dir, tmp_path, timeout_s=0.5)
    with pytest.raises(EngineStartupError, match=re.escape("took longer than 0 s to answer GET /health_generate")):
        engine.start()
    assert engine.process is None


def test_shutdown_deregisters_and_stops_the_server(started):  # last: it stops the module's server
    engine, router = started
    pid, url = engine.pid, engine.url
    assert router.remove_worker(url)
    assert url not in [w["url"] for w in router.list_workers()]
    generated = engine.log_path.read_text().count(GENERATE_MARK)
    with pytest.raises(http_client.EngineHTTPError):  # no worker left behind the router
        http_client.post(router.url + "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})
    engine.shutdown()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert engine.log_path.read_text().count(GENERATE_MARK) == generated  # removed: no traffic reached it


def test_every_generation_request_has_a_timeout(monkeypatch):
    """A server that never answers: each /generate attempt ends at rollout.request_timeout_s and is retried."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from slime.rollout import generate

    monkeypatch.setattr(generate, "RETRIES", 2)
    attempts = []

    async def hang(request):
        attempts.append(1)
        await asyncio.sleep(1.0)  # past the 0.2 s timeout; short, as cleanup waits for handlers

    async def scenario():
        app = web.Application()
        app.add_routes([web.post("/generate", hang)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession() as session:
                with pytest.raises(RuntimeError, match="failed 2 times, last error TimeoutError"):
                    await generate.post_json(session, f"{url}/generate", {"input_ids": [1]}, timeout_s=0.2)
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
    assert len(attempts) == 2


def test_an_adapter_sync_starts_the_server_serving_one_lora_adapter(tmp_path, sglang_parser):
    """model.lora synced alone: SGLang's parser reads LoRA serving on the adapter's targets, at its rank, one adapter
    a batch; without it, none."""
    engine = make_engine("/m", tmp_path)
    engine.launch_spec = dataclasses.replace(
        engine.launch_spec, lora=LoRAServing(max_rank=8, target_modules=("q_proj", "down_proj"))
    )
    args = sglang_parser(engine.command([1, 2, 3])[3:])
    lora = {k: args[k] for k in ("enable_lora", "max_lora_rank", "lora_target_modules", "max_loras_per_batch")}
    assert lora == {
        "enable_lora": True,
        "max_lora_rank": 8,
        "lora_target_modules": ["q_proj", "down_proj"],
        "max_loras_per_batch": 1,
    }
    assert not sglang_parser(make_engine("/m", tmp_path).command([1, 2, 3])[3:])["enable_lora"]


def test_an_engine_spanning_two_nodes_is_a_server_per_node_as_sglang_runs_them(tiny_model_dir, tmp_path, sglang_parser):
    """`EngineLaunch.node_slice`: each node's server gets SGLang's --nnodes / --node-rank / --dist-init-addr and the
    tp of every node's GPUs. Node rank 0 is not ready before the others join at the rendezvous; a node rank >= 1 runs
    SGLang's dummy health server only (no API) and stops once node rank 0 has gone."""
    address = f"127.0.0.1:{free_port()}"
    first, second = (
        make_engine(tiny_model_dir, tmp_path, node_slice=NodeSlice(num_nodes=2, node_rank=r, dist_init_addr=address))
        for r in (0, 1)
    )
    args = sglang_parser(second.command([15001, 15002, 15003])[3:])
    assert (args["nnodes"], args["node_rank"], args["dist_init_addr"], args["tp_size"]) == (2, 1, address, 2)
    assert (first.log_path.name, second.log_path.name) == ("engine_3.log", "engine_3_node1.log")
    first.launch()
    try:
        time.sleep(8)  # long enough for the fake alone to have been ready (it is, in a one-node engine)
        assert not first.client.is_healthy(first.health_path, timeout=2.0)  # waiting for node rank 1
        second.start()
        first.wait_until_ready()
        assert second.client.is_healthy("/health", timeout=2.0)
        with pytest.raises(http_client.EngineHTTPError, match="404"):  # no API on a follower node
            http_client.post(second.url + "/generate", {"input_ids": [1, 2], "sampling_params": {}})
        out = http_client.post(first.url + "/generate", {"input_ids": [1, 5], "sampling_params": {"max_new_tokens": 2}})
        assert len(out["output_ids"]) == 2
        first.shutdown()
        deadline = time.monotonic() + 30
        while second.is_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not second.is_running() and "node rank 0 is gone" in second.log_path.read_text()
    finally:
        first.shutdown()
        second.shutdown()
