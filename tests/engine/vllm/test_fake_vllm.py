"""The fake vLLM server (tests/fakes/fake_vllm.py) answers as vLLM 0.32.0's own code does where that code runs on
this machine: the routes its app mounts for the flags and environment, its request types' refusals and error
bodies, its workers' weight-transfer session rules. Fake only by what they check: the stand-in the other vLLM
tests use for what a CPU vLLM cannot do (sleep mode, NCCL and IPC weight transfers)."""

from __future__ import annotations

import base64
import contextlib
import os
import pickle
import subprocess
import sys
import time

import pytest

from slime.engine import http_client
from slime.net import free_port
from tests.helpers.compose import ROOT

GENERATE = {"token_ids": [1, 5, 11], "sampling_params": {"max_tokens": 3, "temperature": 0.0, "logprobs": 0}}


@contextlib.contextmanager
def fake_server(model_dir: str, log_path, *flags: str, dev_mode: bool):
    """`python -m tests.fakes.fake_vllm` as the engine runs it, with no VLLM_* environment but dev mode's."""
    port = free_port()
    cmd = [sys.executable, "-m", "tests.fakes.fake_vllm", "--model", model_dir, "--host", "127.0.0.1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*cmd, "--port", str(port), *flags], cwd=ROOT, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while not _healthy(url):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _healthy(url: str) -> bool:
    try:
        return http_client.request("GET", url + "/health", timeout=2)[0] == 200
    except http_client.EngineHTTPError:  # not listening yet
        return False


@pytest.fixture(scope="module")
def dev_server(tiny_model_dir, tmp_path_factory):
    """Dev mode, the generate route, the IPC transfer backend, TP 2; pickled handles not allowed."""
    log = tmp_path_factory.mktemp("fake_vllm") / "dev.log"
    flags = ("--enable-scale-out", "--weight-transfer-config", '{"backend": "ipc"}', "--tensor-parallel-size", "2")
    with fake_server(tiny_model_dir, log, *flags, dev_mode=True) as url:
        yield url


def post(url: str, path: str, body=None) -> tuple[int, dict]:
    return http_client.request("POST", url + path, {} if body is None else body)


def test_routes_are_those_vllms_app_mounts_for_the_flags_and_environment(tiny_model_dir, tmp_path):
    """Without --enable-scale-out the generate route is vLLM's own 403, without VLLM_SERVER_DEV_MODE the dev and
    RL routes are not mounted; /version is vLLM's handler."""
    with fake_server(tiny_model_dir, tmp_path / "bare.log", dev_mode=False) as url:
        status, body = post(url, "/inference/v1/generate", GENERATE)
        assert status == 403 and body["error"]["type"] == "PermissionDeniedError"
        assert "Restart vllm serve with --enable-scale-out" in body["error"]["message"]
        assert post(url, "/sleep") == (404, {"detail": "Not Found"})
        assert post(url, "/update_weights", {"update_info": {}}) == (404, {"detail": "Not Found"})
        assert http_client.request("GET", url + "/version") == (200, {"version": "0.32.0"})


def test_generate_requests_are_vllms_types_and_refused_with_its_messages(dev_server):
    status, body = post(dev_server, "/inference/v1/generate", GENERATE)
    assert status == 200 and body["request_id"].startswith("generate-tokens-") and body["output_mode"] == "tokens"
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 3
    # logprobs=0: each position holds the sampled token, and its own entry as the one top entry (vLLM's shape)
    assert [[t["token_id"] for t in e["top_logprobs"]] for e in choice["logprobs"]["content"]] == [
        [t] for t in choice["token_ids"]
    ]
    refused = {
        "top_k": ({**GENERATE, "sampling_params": {"top_k": -3}}, 400, "top_k must be 0 (disable), or at least 1"),
        "missing": ({"token_ids": [1]}, 400, "body.sampling_params"),
        "empty": ({**GENERATE, "token_ids": []}, 400, "body.token_ids"),
        "model": ({**GENERATE, "model": "other"}, 404, "The model `other` does not exist"),
    }
    for name, (request, code, text) in refused.items():
        status, body = post(dev_server, "/inference/v1/generate", request)
        assert (status, body["error"]["code"]) == (code, code), name
        assert text in body["error"]["message"] + str(body["error"]["param"]), (name, body)


def test_routes_refuse_what_vllm_refuses(dev_server):
    status, body = post(dev_server, "/sleep?level=3")
    assert status == 400 and body["error"]["param"] == "query.level"
    status, body = post(dev_server, "/pause?mode=later")
    assert status == 400 and body["error"]["param"] == "query.mode"
    assert http_client.request("GET", dev_server + "/pause") == (405, {"detail": "Method Not Allowed"})
    assert post(dev_server, "/no_such_route") == (404, {"detail": "Not Found"})
    status, body = post(dev_server, "/collective_rpc", {"args": []})
    assert (status, body["error"]["message"]) == (400, "Missing 'method' in request body")
    status, body = post(dev_server, "/v1/completions", {"prompt": "x"})  # vLLM's route, not the fake's
    assert status == 501 and "does not serve vllm.entrypoints.openai.completion" in body["error"]["message"]


def test_weight_transfers_follow_vllms_workers_and_update_info_checks(dev_server):
    """Worker.update_weights' session rules and IPCWeightTransferUpdateInfo's checks, answered as a failed
    collective_rpc of two workers; a failed update ends the session, as in Worker."""
    worker = "Call to collective_rpc method failed: Worker failed with error '{}', please check the stack trace"
    status, body = post(dev_server, "/update_weights", {"update_info": {"names": []}})
    assert status == 500 and body["error"]["message"].startswith(
        worker.format("start_weight_update must be called before update_weights.")
    )
    status, body = post(dev_server, "/init_weight_transfer_engine", {"init_info": {"packed": True, "rank": 0}})
    assert status == 500 and "Invalid init_info for IPCWeightTransferEngine" in body["error"]["message"]
    assert post(dev_server, "/init_weight_transfer_engine", {"init_info": {"packed": True}})[0] == 200
    assert post(dev_server, "/start_weight_update")[0] == 200
    handles = base64.b64encode(pickle.dumps({"cpu": ("/dev/shm/none", 0, 8)})).decode()
    update = {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2]], "ipc_handles_pickled": handles}
    status, body = post(dev_server, "/update_weights", {"update_info": {**update, "tensor_sizes": [8]}})
    assert status == 500 and "without VLLM_ALLOW_INSECURE_SERIALIZATION=1" in body["error"]["message"]
    status, body = post(dev_server, "/finish_weight_update", {"weight_version": "3"})
    assert status == 500 and "finish_weight_update called without a matching start_weight_update" in str(body)
    status, body = post(dev_server, "/update_weights", {})
    assert status == 400 and body["error"]["param"] == "body.update_info"


def test_vllms_executor_marks_tags_awake_only_after_its_workers_woke():
    """The fake's wake_up order: vLLM's `Executor.wake_up` (vllm/v1/executor/abstract.py) runs the workers' wake_up
    while the tags still read asleep and removes them after, so a request that waits for every tag to be awake finds
    the memory back (the fake queues such requests on `sleeping_tags`: tests/helpers/fake_vllm_generate.py)."""
    from types import SimpleNamespace

    from vllm.v1.executor.abstract import Executor

    seen: list[set[str]] = []
    executor = SimpleNamespace(is_sleeping=True, sleeping_tags={"weights", "kv_cache"})
    executor.collective_rpc = lambda method, kwargs: seen.append(set(executor.sleeping_tags))
    Executor.wake_up(executor, ["kv_cache"])
    assert seen == [{"weights", "kv_cache"}] and executor.sleeping_tags == {"weights"}
