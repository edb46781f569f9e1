"""The hf engine server behind the real sglang-router: 2 real server processes, no mocks.

Tests in this module share one router + 2 engines and run in file order (the last one shuts
everything down and checks that no process survives).
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
from safetensors.torch import load_file, save_file

from slime.config.schema import RouterConfig
from slime.engine import http_client
from slime.engine.base import EngineLaunch, get_engine_class
from slime.engine.hf.config import HFEngineConfig
from slime.engine.hf.weight_checker import tensor_checksum
from slime.engine.http_client import EngineHTTPError
from slime.engine.router import Router
from tests.helpers.engines import generated_tokens
from tests.helpers.processes import in_thread, joined

PROMPT = [1, 5, 11, 16, 28]
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("engine_logs")
    router = Router.launch(
        cfg=RouterConfig(policy="round_robin", startup_timeout_s=120), log_path=log_dir / "router.log"
    )
    cfg = HFEngineConfig(max_batch_size=8, batch_wait_ms=5.0, num_threads=1, startup_timeout_s=300)
    engine_cls = get_engine_class("hf")
    engines = [
        engine_cls(
            EngineLaunch(
                rank=i,
                model_path=tiny_model_dir,
                host="127.0.0.1",
                seed=100 + i,
                device="cpu",
                log_dir=str(log_dir),
                startup_timeout_s=300,
            ),
            cfg,
        )
        for i in range(2)
    ]
    try:
        for engine in engines:  # start both, then wait: the two imports overlap
            engine.launch()
        for engine in engines:
            engine.wait_until_ready()
            router.add_worker(engine.url)
        yield SimpleNamespace(router=router, engines=engines, model_dir=tiny_model_dir, log_dir=log_dir)
    finally:
        for engine in engines:
            engine.shutdown()
        router.shutdown()


def _served(engine) -> int:
    return http_client.get(engine.url + "/server_info")["internal_states"][0]["num_finished_reqs"]


def _generate(url: str, prompt=PROMPT, timeout=60.0, **params) -> dict:
    body = {"input_ids": list(prompt), "sampling_params": params or dict(GREEDY), "return_logprob": True}
    return http_client.post(url + "/generate", body, timeout=timeout)


def _check_response(resp: dict, weight_version: str = "0") -> None:
    meta = resp["meta_info"]
    assert isinstance(resp["text"], str)
    assert meta["finish_reason"]["type"] in {"stop", "length"}
    assert meta["completion_tokens"] == len(resp["output_ids"]) == len(meta["output_token_logprobs"])
    assert 0 <= meta["cached_tokens"] < meta["prompt_tokens"] and meta["weight_version"] == weight_version
    for (logprob, token_id, *_), out_id in zip(meta["output_token_logprobs"], resp["output_ids"]):
        assert isinstance(logprob, float) and logprob <= 0
        assert isinstance(token_id, int) and token_id == out_id


def test_concurrent_generate_through_router(cluster):
    before = [_served(e) for e in cluster.engines]
    bodies = [
        {
            "input_ids": PROMPT[: 1 + i % 5] + [30 + i % 10],
            "sampling_params": {"max_new_tokens": 4 + i % 6, "temperature": 1.0, "top_p": 0.95, "stop_token_ids": [40]},
            "return_logprob": True,
        }
        for i in range(20)
    ]
    with ThreadPoolExecutor(20) as pool:
        responses = list(pool.map(lambda b: http_client.post(cluster.router.url + "/generate", b), bodies))
    for body, resp in zip(bodies, responses):
        _check_response(resp)
        assert resp["meta_info"]["prompt_tokens"] == len(body["input_ids"])
        assert resp["meta_info"]["completion_tokens"] <= body["sampling_params"]["max_new_tokens"]
    served = [_served(e) - b for e, b in zip(cluster.engines, before)]
    assert sum(served) == 20 and min(served) >= 5, served  # round_robin: both workers get traffic


def test_bad_requests_are_400(cluster):
    engine_url, router_url = cluster.engines[0].url, cluster.router.url
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "not_a_param": 1}}
    status, resp = http_client.request("POST", engine_url + "/generate", body)
    assert status == 400 and "not_a_param" in resp["error"]["message"]
    # sglang-router 0.3.2 re-serialises sampling_params from a typed struct: unknown keys are dropped
    # before they reach the engine, so the same body succeeds through the router...
    status, _ = http_client.request("POST", router_url + "/generate", body)
    assert status == 200
    # ...while a key the router forwards but this engine cannot honour comes back as the engine's 400.
    body["sampling_params"] = {"max_new_tokens": 2, "json_schema": "{}"}
    status, resp = http_client.request("POST", router_url + "/generate", body)
    assert status == 400 and "json_schema" in str(resp)
    status, resp = http_client.request("POST", engine_url + "/generate", {"sampling_params": {}})
    assert status == 400 and "input_ids" in resp["error"]["message"]


def test_batch_text_and_info_endpoints(cluster):
    url = cluster.engines[0].url
    batch = http_client.post(
        url + "/generate",
        {
            "input_ids": [PROMPT, [4, 9]],
            "sampling_params": {"max_new_tokens": 3},
            "rid": ["r1", "r2"],
            "return_logprob": True,
            "return_text_in_logprobs": True,
            "model": None,
            "stream": False,
            "no_logs": False,
        },
    )
    assert [r["meta_info"]["id"] for r in batch] == ["r1", "r2"]
    assert all(isinstance(e[2], str) for r in batch for e in r["meta_info"]["output_token_logprobs"])
    single = http_client.post(
        url + "/generate", {"text": "what is 1 plus 2 ?", "sampling_params": {"max_new_tokens": 2}}
    )
    assert single["meta_info"]["prompt_tokens"] == 6 and "output_token_logprobs" not in single["meta_info"]
    for path in ("/server_info", "/get_server_info"):
        info = http_client.get(url + path)
        assert info["model_path"] == cluster.model_dir and info["device"] == "cpu" and info["seed"] == 100
        assert info["dtype"] == "float32" and info["max_batch_size"] == 8
    for path in ("/model_info", "/get_model_info"):
        info = http_client.get(url + path)
        assert info["is_generation"] is True and info["architectures"] == ["Qwen3ForCausalLM"]
        assert info["model_type"] == "qwen3" and info["weight_version"] == "0"
    idle = {"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0, "num_total_reqs": 0}
    assert http_client.get(url + "/v1/loads?include=core")["loads"] == [idle]
    # every section unless asked for some, as SGLang's: the memory one holds the checkpoint's bytes (and the rotary
    # table's 64), in GiB; no peak on a CPU
    checkpoint = sum(t.nbytes for f in Path(cluster.model_dir).glob("*.safetensors") for t in load_file(f).values())
    memory = {"weight_gb": pytest.approx((checkpoint + 64) / 2**30, rel=1e-9)}
    assert http_client.get(url + "/v1/loads")["loads"] == [{**idle, "memory": memory}]
    assert cluster.engines[0].client.memory_gib() == {"weight": memory["weight_gb"]}
    assert http_client.request("GET", url + "/health")[0] == 200
    assert http_client.request("POST", url + "/flush_cache")[0] == 200
    assert cluster.engines[0].client.is_healthy()


def test_prefix_cache_serves_a_repeated_lone_prompt(cluster):
    """A prompt decoded alone again reuses its prefill (counted as SGLang counts a whole-prompt hit:
    prompt length - 1) and its first token's decode step, with the same output; a batch bypasses the
    cache; /flush_cache empties it."""
    url = cluster.engines[0].url
    prompt, params = [1, 7, 9, 11, 3], {"max_new_tokens": 6, "temperature": 1.0, "sampling_seed": 7}
    assert http_client.request("POST", url + "/flush_cache")[0] == 200
    first, second = _generate(url, prompt, **params), _generate(url, prompt, **params)
    assert (first["meta_info"]["cached_tokens"], second["meta_info"]["cached_tokens"]) == (0, len(prompt) - 1)
    assert second["output_ids"] == first["output_ids"]
    assert second["meta_info"]["output_token_logprobs"] == first["meta_info"]["output_token_logprobs"]
    batch = http_client.post(url + "/generate", {"input_ids": [prompt, prompt], "sampling_params": params})
    assert [r["meta_info"]["cached_tokens"] for r in batch] == [0, 0]
    state = http_client.get(url + "/server_info")["internal_states"][0]
    assert state["prefix_cache_entries"] == 2 and state["prefix_cache_tokens"] == 2 * len(prompt) + 1
    assert http_client.request("POST", url + "/flush_cache")[0] == 200
    assert _generate(url, prompt, **params)["meta_info"]["cached_tokens"] == 0


def _wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _start_long_generation(engine, **params):
    """A 480-token request in a thread, returned once it runs and has sampled a token (a pause or an
    abort then cuts it mid-decode, however slow the machine: being in the batch is not enough)."""
    before = generated_tokens(engine.url)
    running = in_thread(lambda: _generate(engine.url, max_new_tokens=480, ignore_eos=True, **params))
    _wait_for(lambda: generated_tokens(engine.url) > before)
    assert http_client.get(engine.url + "/v1/loads")["loads"][0]["num_running_reqs"] == 1
    return running


def _perturbed_copy(src: str, dst: Path, *, noise: float = 0.3, bad_shape: bool = False, drop: bool = False) -> str:
    tensors = load_file(str(Path(src) / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    out = {name: t + noise * torch.randn(t.shape, generator=gen) for name, t in tensors.items()}
    name = sorted(out)[-1]
    if bad_shape:
        out[name] = torch.zeros(out[name].shape[0] + 1, *out[name].shape[1:])
    if drop:
        del out[name]
    dst.mkdir(parents=True)
    save_file(out, str(dst / "model.safetensors"))
    shutil.copy(Path(src) / "config.json", dst)  # a checkpoint: every weight must be there
    return str(dst)


def test_update_weights_from_disk(cluster, tmp_path):
    engine = cluster.engines[0]
    before = _generate(engine.url)
    # An update never lands mid-batch: it waits for the running generation, which keeps version "0".
    running, box = _start_long_generation(engine)
    engine.client.update_weights_from_disk(_perturbed_copy(cluster.model_dir, tmp_path / "v1"), weight_version="1")
    meta = joined(running, box, 20)["meta_info"]
    assert meta["weight_version"] == "0" and meta["finish_reason"] == {"type": "length", "length": 480}
    after = _generate(engine.url)
    _check_response(after, weight_version="1")
    assert after["meta_info"]["cached_tokens"] == 0  # the update emptied the prefix cache
    assert engine.client.get_weight_version() == "1"
    assert after["meta_info"]["output_token_logprobs"] != before["meta_info"]["output_token_logprobs"]
    assert after["output_ids"] != before["output_ids"]

    for kind, bad in (("shape", {"bad_shape": True}), ("missing", {"drop": True})):
        path = _perturbed_copy(cluster.model_dir, tmp_path / f"bad_{kind}", noise=1.0, **bad)
        status, resp = http_client.request(
            "POST", engine.url + "/update_weights_from_disk", {"model_path": path, "weight_version": "2"}
        )
        assert status == 400 and resp["success"] is False and kind in resp["message"]
        with pytest.raises(EngineHTTPError, match=kind):
            engine.client.update_weights_from_disk(path, weight_version="2")
    again = _generate(engine.url)  # the failed loads changed nothing
    assert again["output_ids"] == after["output_ids"] and engine.client.get_weight_version() == "1"


def test_a_directory_of_some_named_tensors_updates_those_alone(cluster, tmp_path):
    """No config.json: not a checkpoint but some named tensors (an adapter sync's trained gains), which update
    those weights alone, as SGLang's loader loads the names a directory holds; a foreign name or shape is refused
    before anything is copied."""
    engine = cluster.engines[0]
    start = _perturbed_copy(cluster.model_dir, tmp_path / "start")  # as test_update_weights_from_disk left it
    engine.client.update_weights_from_disk(start, weight_version="1")
    weights = load_file(str(Path(start) / "model.safetensors"))
    norm = weights["model.norm.weight"]
    before = _generate(engine.url)
    for name, tensors in (
        ("foreign", {"model.norm.weight": norm * 3, "model.nope.weight": norm}),
        ("shape", {"model.norm.weight": torch.ones(norm.shape[0] + 1)}),
    ):
        (tmp_path / name).mkdir()
        save_file(tensors, str(tmp_path / name / "model.safetensors"))
        with pytest.raises(
            EngineHTTPError, match="unexpected tensors: model.nope.weight" if name == "foreign" else name
        ):
            engine.client.update_weights_from_disk(str(tmp_path / name), weight_version="2")
    assert _generate(engine.url)["meta_info"]["output_token_logprobs"] == before["meta_info"]["output_token_logprobs"]
    (tmp_path / "gain").mkdir()
    save_file({"model.norm.weight": norm * 3}, str(tmp_path / "gain" / "model.safetensors"))
    engine.client.update_weights_from_disk(str(tmp_path / "gain"), weight_version="2")
    sharper = _generate(engine.url)
    assert sharper["meta_info"]["weight_version"] == "2"
    assert sharper["meta_info"]["output_token_logprobs"] != before["meta_info"]["output_token_logprobs"]
    checksums = engine.client.check_weights("checksum")["ranks"][0]["checksums"]
    assert checksums["model.norm.weight"] == tensor_checksum(norm * 3)
    assert checksums["model.embed_tokens.weight"] == tensor_checksum(weights["model.embed_tokens.weight"])
    engine.client.update_weights_from_disk(start, weight_version="1")  # as it was: later tests expect version 1


def test_pause_aborts_running_and_holds_new_requests(cluster):
    engine = cluster.engines[0]
    loads = lambda: http_client.get(engine.url + "/v1/loads")["loads"][0]  # noqa: E731
    running, running_box = _start_long_generation(engine, temperature=1.0)
    try:
        engine.client.pause_generation()  # SGLang's default mode: in-flight requests are aborted
        aborted = joined(running, running_box, 20)["meta_info"]
        assert aborted["finish_reason"]["type"] == "abort"
        assert 0 < aborted["completion_tokens"] < 480
        assert len(aborted["output_token_logprobs"]) == aborted["completion_tokens"]

        held, held_box = in_thread(lambda: _generate(engine.url))
        _wait_for(lambda: loads()["num_waiting_reqs"] == 1)
        time.sleep(0.3)
        assert held.is_alive() and "result" not in held_box
        engine.client.flush_cache(max_attempts=1)  # a request held by the pause holds no cache
    finally:  # a failed check must not leave the shared engine paused for the tests after it
        engine.client.continue_generation()
    assert joined(held, held_box, 20)["meta_info"]["finish_reason"]["type"] == "length"


def test_abort_request(cluster):
    engine = cluster.engines[0]
    thread, box = _start_long_generation(engine)
    engine.client.abort_all()
    meta = joined(thread, box, 20)["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and 0 < meta["completion_tokens"] < 480


def test_release_and_resume_memory(cluster):
    engine = cluster.engines[1]
    engine.client.release_memory()
    status, resp = http_client.request("POST", engine.url + "/generate", {"input_ids": PROMPT})
    assert status == 400 and "released" in resp["error"]["message"]
    assert not engine.client.is_healthy()
    engine.client.resume_memory(["weights"])
    assert http_client.get(engine.url + "/server_info")["internal_states"][0]["released_tags"] == [
        "cuda_graph",
        "kv_cache",
    ]
    assert http_client.request("POST", engine.url + "/generate", {"input_ids": PROMPT})[0] == 400
    engine.client.resume_memory(["kv_cache", "cuda_graph"])
    _check_response(_generate(engine.url))
    assert engine.client.is_healthy()
    status, _ = http_client.request("POST", engine.url + "/release_memory_occupation", {"tags": ["bogus"]})
    assert status == 400


def test_the_memory_calls_sglangs_scheduler_dies_on_are_refused(cluster):
    """Where SGLang's scheduler dies (tests/engine/sglang/test_fake_sglang_rules.py), the built-in engine answers 400."""
    engine = cluster.engines[1]
    status, body = http_client.request("POST", engine.url + "/resume_memory_occupation", {"tags": ["weights"]})
    assert status == 400 and "not released: ['weights']" in body["error"]["message"]
    thread, box = _start_long_generation(engine)
    status, body = http_client.request("POST", engine.url + "/release_memory_occupation", {})
    assert status == 400 and "only when server is idle" in body["error"]["message"]
    assert joined(thread, box, 30)["meta_info"]["completion_tokens"] == 480  # the request went on
    assert http_client.get(engine.url + "/server_info")["internal_states"][0]["released_tags"] == []


def test_connect_to_existing_router(cluster):
    external = Router.connect(cluster.router.url.removeprefix("http://"))
    assert external.url == cluster.router.url and external.process is None
    assert sorted(w["url"] for w in external.list_workers()) == sorted(e.url for e in cluster.engines)
    external.shutdown()  # leaves the router alone
    assert (
        cluster.router.process.poll() is None and http_client.request("GET", cluster.router.url + "/health")[0] == 200
    )


def test_remove_worker_stops_traffic(cluster):
    router, (kept, removed) = cluster.router, cluster.engines
    assert router.remove_worker(removed.url) is True
    assert [w["url"] for w in router.list_workers()] == [kept.url]
    assert router.remove_worker(removed.url) is False
    before = (_served(kept), _served(removed))
    for _ in range(6):
        _check_response(_generate(router.url), weight_version="1")  # only the updated engine is left
    assert (_served(kept), _served(removed)) == (before[0] + 6, before[1])


def test_shutdown_leaves_no_process(cluster):
    procs = [cluster.router.process] + [e.process for e in cluster.engines]
    pids = set()
    for proc in procs:
        pids.add(proc.pid)
        pids.update(child.pid for child in psutil.Process(proc.pid).children(recursive=True))
    for engine in cluster.engines:
        engine.shutdown()
        engine.shutdown()  # idempotent
    cluster.router.shutdown()
    assert all(proc.poll() is not None for proc in procs)
    assert [pid for pid in pids if psutil.pid_exists(pid)] == []
