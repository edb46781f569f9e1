"""The rules of SGLang 0.5.23's scheduler and health route, as the fake SGLang server enforces them (each pins a
comment of tests/fakes/fake_sglang.py or slime/engine/hf/control.py to SGLang's behaviour):

- `/health` generates one token: it waits while generation is paused and answers 503 after
  SGLANG_HEALTH_CHECK_TIMEOUT seconds (`http_server.py:health_generate`), 200 once generation continues;
- the scheduler dies on `resume_memory_occupation` of a tag that is not released (`offload_tags.remove`), on
  `release_memory_occupation` while a request runs (its idle assertion), and on a health generation while
  memory is released (it would run on freed memory), and on an adapter whose tensors miss their
  `expected_checksums` (`tp_worker.py:load_lora_adapter_from_tensors` raises), and the server with it."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from slime.engine import http_client
from slime.engine.base import LoRAServing
from slime.engine.http_client import EngineHTTPError
from slime.sync.tensor import packed
from slime.wire import bucket_codec
from tests.fakes.fake_sglang import CRASH_MARK
from tests.helpers.engines import generated_tokens
from tests.helpers.fake_sglang_engine import make_engine
from tests.helpers.processes import in_thread

HEALTH_TIMEOUT_S = 2  # whole seconds: SGLang reads the variable with int()


@pytest.fixture
def fake(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", str(HEALTH_TIMEOUT_S))
    engine = make_engine(tiny_model_dir, tmp_path)
    engine.start()
    yield engine
    engine.shutdown()


def assert_crashed(engine, reason: str) -> None:
    """The server process ended on its own, its log naming the scheduler's exception."""
    deadline = time.monotonic() + 30
    while engine.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.process.poll() is not None, "the server is still running"
    assert f"{CRASH_MARK}: " in engine.log_path.read_text() and reason in engine.log_path.read_text()


def health(engine) -> tuple[int, float]:
    start = time.monotonic()
    status, _ = http_client.request("GET", engine.url + "/health", timeout=60)
    return status, time.monotonic() - start


def test_health_waits_while_paused_then_answers_503_and_200_once_generation_continues(fake):
    assert health(fake)[0] == 200
    fake.client.pause_generation()
    status, waited = health(fake)
    assert status == 503 and waited >= HEALTH_TIMEOUT_S
    fake.client.continue_generation()
    assert health(fake)[0] == 200


def test_resuming_a_tag_that_was_not_released_kills_the_server(fake):
    with pytest.raises(EngineHTTPError):
        fake.client.resume_memory(["weights"])
    assert_crashed(fake, "not released: ['weights']")


def test_releasing_while_a_request_runs_kills_the_server(fake):
    long_request = {"input_ids": [1, 5, 11], "sampling_params": {"max_new_tokens": 480, "ignore_eos": True}}

    def generate():  # the server dies under it
        try:
            return http_client.request("POST", fake.url + "/generate", long_request, timeout=120)
        except EngineHTTPError as exc:
            return exc

    sampled = lambda: generated_tokens(fake.url)  # noqa: E731
    running = lambda: fake.client.loads()["loads"][0]["num_running_reqs"] > 0  # noqa: E731
    before = sampled()  # the start-up health probe's token may land after this: two more are the request's
    in_thread(generate)
    deadline = time.monotonic() + 60
    while not (running() and sampled() > before + 1):  # running and decoding: release arrives mid-request
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.02)
    with pytest.raises(EngineHTTPError):
        fake.client.release_memory()
    assert_crashed(fake, "only when server is idle")


def test_a_health_probe_while_memory_is_released_kills_the_server(fake):
    fake.client.release_memory()
    with pytest.raises(EngineHTTPError):
        http_client.get(fake.url + "/health", timeout=30)
    assert_crashed(fake, "health generation on released memory")


def test_an_adapter_tensor_missing_its_checksum_kills_the_server(tiny_model_dir, tmp_path):
    """SGLang's own tp_worker intake, run by the fake for each TP rank: the [LORA-CHECK] error of a changed tensor
    is raised in the scheduler, which dies of it."""
    engine = make_engine(tiny_model_dir, tmp_path, lora=LoRAServing(max_rank=8, target_modules=("q_proj",)))
    engine.start()
    try:
        name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
        with packed([(name, torch.ones(8, 64))]) as (flat, metadata):
            with pytest.raises(EngineHTTPError):
                engine.client.load_lora_adapter_from_tensors(
                    "policy", {"r": 8, "lora_alpha": 16}, [bucket_codec.encode(flat, metadata)],
                    expected_checksums={name: "0" * 64},
                )  # fmt: skip
        assert_crashed(engine, "[LORA-CHECK] rank0 adapter sync MISMATCH of 1 expected: 1 value-diff")
    finally:
        engine.shutdown()


def test_deterministic_inference_is_batch_invariant_decoding_as_in_sglang():
    """SGLang's --enable-deterministic-inference switches its batch-invariant kernels on; the fake hands the hf
    engine its same flag (batch-invariant decoding), and nothing else of the fake's arguments changes."""
    from tests.fakes.fake_sglang import hf_args
    from tests.helpers.sglang_real import require

    runner = (require() / "sglang" / "srt" / "model_executor" / "model_runner.py").read_text()
    body = runner.split("def maybe_enable_batch_invariant_mode", 1)[1].split("\n    def ", 1)[0]
    assert "enable_deterministic_inference" in body and "enable_batch_invariant_mode()" in body
    server_args = SimpleNamespace(
        model_path="/m", host=None, port=1, random_seed=0, weight_version=None, context_length=None,
        enable_deterministic_inference=False, enable_return_routed_experts=False, enable_lora=False,
    )  # fmt: skip
    plain = vars(hf_args(server_args))
    deterministic = vars(hf_args(SimpleNamespace(**{**vars(server_args), "enable_deterministic_inference": True})))
    assert plain["enable_deterministic_inference"] is False and deterministic["enable_deterministic_inference"] is True
    assert {k: v for k, v in deterministic.items() if k != "enable_deterministic_inference"} == {
        k: v for k, v in plain.items() if k != "enable_deterministic_inference"
    }
