"""The real sglang-router (0.3.2) between our rollout and a recording worker (tests/helpers/recording_worker.py):
which /generate fields reach the engine, and that the router's own health checks and circuit breaker are off.

The router runs as the run launches it (`Router.launch`); only the worker behind it is a stand-in, answering the
router's registration probes and recording every request body it receives. Last, `rollout.router.extra_args`
cannot turn the router's health checks or circuit breaker back on (validation, and the launch itself).
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import json
import time
import urllib.error
import urllib.request

import aiohttp
import pytest

from slime.config import ConfigError
from slime.config.schema import RolloutConfig, RouterConfig
from slime.engine.ports import reserve_ports
from slime.engine.router import DROPPED_REQUEST_FIELDS, DROPPED_SAMPLING_PARAMS, Router
from slime.engine.vllm.router import VLLMRouter
from slime.plan.validate import validate
from slime.rollout.base import RolloutContext
from slime.rollout.generate import call_engine
from slime.rollout.producer import sampling_params
from slime.types import Sample
from tests.helpers.compose import typed_config
from tests.helpers.recording_worker import RecordingWorker
from tests.helpers.runs import assert_stopped_in_validation, run_main
from tests.helpers.sglang_real import require
from tests.helpers.vllm_real import CPU_VLLM

# A value of the wire type SGLang 0.5.23 gives each SamplingParams field (sglang/srt/sampling/sampling_params.py).
SAMPLING_VALUES = {
    "max_new_tokens": 4,
    "stop": ["x"],
    "stop_token_ids": [7],
    "stop_regex": "z+",
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 5,
    "min_p": 0.1,
    "frequency_penalty": 0.1,
    "presence_penalty": 0.2,
    "repetition_penalty": 1.1,
    "min_new_tokens": 1,
    "n": 1,
    "beam_width": 2,
    "json_schema": "{}",
    "regex": "a+",
    "ebnf": 'root ::= "a"',
    "structural_tag": "{}",
    "ignore_eos": True,
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "no_stop_trim": True,
    "stream_interval": 2,
    "logit_bias": {"5": 1.0},
    "sampling_seed": 3,
    "custom_params": {"a": 1},
    "watermark": {"a": 1},
    "stop_strs": ["y"],
    "stop_regex_strs": ["q"],
    "stop_str_max_len": 1,
    "stop_regex_max_len": 1,
    "is_normalized": False,
    "ebnf_full_assistant": False,
}


def sglang_sampling_fields() -> list[str]:
    """SamplingParams' fields in the pinned SGLang wheel: a msgspec Struct, its fields the annotated class
    attributes (what `SamplingParams(**kwargs)` accepts), read with `ast` (no import)."""
    source = (require() / "sglang" / "srt" / "sampling" / "sampling_params.py").read_text()
    (cls,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "SamplingParams"]
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)]


def post_generate(router_url: str, body: dict) -> int:
    request = urllib.request.Request(
        router_url + "/generate", json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    recorder = RecordingWorker(tiny_model_dir).start()  # the router loads its tokenizer from model_path
    yield recorder
    recorder.stop()


@pytest.fixture(scope="module")
def router(worker, tmp_path_factory):
    launched = Router.launch(cfg=RouterConfig(), log_path=tmp_path_factory.mktemp("router") / "router.log")
    launched.add_worker(worker.url)
    yield launched
    launched.shutdown()


def test_the_router_drops_exactly_these_sampling_params(router, worker):
    assert sorted(SAMPLING_VALUES) == sorted(sglang_sampling_fields())  # every field the pinned SGLang takes
    sent = {"input_ids": [1, 2, 3], "sampling_params": SAMPLING_VALUES, "return_logprob": True, "lora_path": "policy"}
    count = len(worker.bodies("/generate"))
    assert post_generate(router.url, sent) == 200
    received = worker.wait_for("/generate", count + 1)[-1]
    arrived = received["sampling_params"]
    assert set(SAMPLING_VALUES) - set(arrived) == DROPPED_SAMPLING_PARAMS
    assert {k: v for k, v in SAMPLING_VALUES.items() if k not in DROPPED_SAMPLING_PARAMS} == arrived  # unchanged
    kept = (
        "input_ids",
        "return_logprob",
        "lora_path",
    )  # lora_path: the policy's adapter (model.lora, slime.sync.adapter)
    assert {k: received.get(k) for k in kept} == {"input_ids": [1, 2, 3], "return_logprob": True, "lora_path": "policy"}


def test_the_router_forwards_a_prompts_images(router, worker):
    """A vision-language prompt's `image_data` reaches the engine through sglang-router as sent."""
    refs = ["data:image/png;base64,iVBORw0KGgo=", "/data/images/7.png"]
    sent = {"input_ids": [1, 80, 82, 82, 81], "sampling_params": {"max_new_tokens": 1}, "image_data": refs}
    count = len(worker.bodies("/generate"))
    assert post_generate(router.url, sent) == 200
    received = worker.wait_for("/generate", count + 1)[-1]
    assert received["image_data"] == refs and received["input_ids"] == sent["input_ids"]


def test_the_router_drops_the_routed_experts_request_and_the_rollout_goes_to_a_worker(router, worker):
    """sglang-router 0.3.2 strips return_routed_experts (routing replay's request for the routes) from /generate, so
    call_engine sends such a request to one of the router's workers itself, the body whole."""
    sent = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}, "return_routed_experts": True}
    count = len(worker.bodies("/generate"))
    assert post_generate(router.url, sent) == 200
    received = worker.wait_for("/generate", count + 1)[-1]
    assert set(sent) - set(received) == DROPPED_REQUEST_FIELDS == {"return_routed_experts"}

    config = RolloutConfig()

    async def go():
        async with aiohttp.ClientSession() as session:
            args = dataclasses.replace(rollout_context(router.url, config, session), return_routed_experts=True)
            return await call_engine(
                args, Sample(index=0, group_index=3, prompt="p", tokens=[1, 2, 3]), {"max_new_tokens": 4}
            )

    asyncio.run(go())
    direct = worker.wait_for("/generate", count + 2)[-1]
    assert direct["return_routed_experts"] is True and direct["input_ids"] == [1, 2, 3]


def rollout_context(router_url: str, config: RolloutConfig, session) -> RolloutContext:
    return RolloutContext(
        config=config,
        router_url=router_url,
        tokenizer=None,  # the samples below carry their tokens
        batch_size=1,
        over_sampling_batch_size=1,
        sampling_params=sampling_params(config, config),
        max_in_flight=1,
        rewards=None,
        sampling_seed=11,
        session=session,
    )


def call(router_url: str, config: RolloutConfig, params: dict) -> dict:
    async def go():
        async with aiohttp.ClientSession() as session:
            sample = Sample(index=0, prompt="p", tokens=[1, 2, 3])
            return await call_engine(rollout_context(router_url, config, session), sample, params)

    return asyncio.run(go())


def test_every_sampling_param_the_rollout_sends_reaches_the_engine(router, worker):
    config = RolloutConfig(stop=["</s>"], stop_token_ids=[5], skip_special_tokens=False, top_k=20, top_p=0.8)
    params = sampling_params(config, config)
    count = len(worker.bodies("/generate"))
    out = call(router.url, config, params)
    assert out["meta_info"]["output_token_logprobs"] == [[-0.5, 64, None]]
    received = worker.wait_for("/generate", count + 1)[-1]
    # what call_engine adds: the response budget and the per-request seed (rollout.deterministic)
    assert set(received["sampling_params"]) == {*params, "sampling_seed"}
    assert {k: received["sampling_params"][k] for k in params} == params
    assert received["input_ids"] == [1, 2, 3] and received["return_logprob"] is True


def test_a_sampling_param_the_router_drops_is_refused_before_it_is_sent(router, worker):
    config = RolloutConfig()
    count = len(worker.bodies("/generate"))
    with pytest.raises(ValueError, match=r"\['logit_bias', 'spaces_between_special_tokens'\] do not reach the engine"):
        call(
            router.url,
            config,
            {**sampling_params(config, config), "logit_bias": {"5": 1.0}, "spaces_between_special_tokens": False},
        )
    assert len(worker.bodies("/generate")) == count


class ProbingRouter(Router):
    """The run's router flags, with the router's probe interval and breaker threshold made short enough for a
    test: if its health checks or circuit breaker were on, they would act within seconds."""

    def flags(self, *args) -> list[str]:
        return [*super().flags(*args), "--health-check-interval-secs", "1", "--cb-failure-threshold", "2"]


def test_the_routers_health_checks_and_circuit_breaker_are_off(tiny_model_dir, tmp_path):
    worker = RecordingWorker(tiny_model_dir).start()
    router = ProbingRouter.launch(cfg=RouterConfig(), log_path=tmp_path / "router.log")
    try:
        router.add_worker(worker.url)
        assert len(worker.bodies("/health")) == 1  # the registration probe
        worker.failing = True  # a worker that fails for a while (a long weight push)
        assert [post_generate(router.url, {"input_ids": [1], "sampling_params": {}}) for _ in range(3)] == [503] * 3
        failed = len(worker.bodies("/generate"))
        assert failed > 2  # past the breaker's threshold, each request still reached the worker
        worker.failing = False
        assert post_generate(router.url, {"input_ids": [1], "sampling_params": {}}) == 200
        assert len(worker.bodies("/generate")) == failed + 1
        time.sleep(3.5)  # three of the router's probe intervals: no probe may come
        assert len(worker.bodies("/health")) == 1, worker.requests
    finally:
        router.shutdown()
        worker.stop()


@pytest.mark.parametrize(
    "overrides,key,text",
    [
        (["+rollout.router.extra_args.disable_health_check=false"], "disable_health_check", "health checks stay off"),
        (["+rollout.router.extra_args.health_check_interval_secs=5"], "health_check_interval_secs", "stay off"),
        (["+rollout.router.extra_args.disable_circuit_breaker=false"], "disable_circuit_breaker", "breaker stays off"),
        (["+rollout.router.extra_args.cb_failure_threshold=3"], "cb_failure_threshold", "breaker stays off"),
        (
            [*CPU_VLLM, "+rollout.router.extra_args.cb_window_duration_secs=3"],
            "cb_window_duration_secs",
            "breaker",
        ),
    ],
)
def test_extra_args_cannot_turn_the_routers_health_checks_or_breaker_back_on(overrides, key, text):
    with pytest.raises(ConfigError) as info:
        validate(typed_config(overrides))
    (problem,) = info.value.problems
    assert problem.key == f"rollout.router.extra_args.{key}" and text in problem.message
    assert "rollout.fault_tolerance" in problem.fix
    with pytest.raises(ValueError, match=key):  # a launch that skipped validation refuses it too
        router_cls = VLLMRouter if "rollout=vllm" in overrides else Router
        router_cls(url="http://127.0.0.1:1").flags("127.0.0.1", 1, 2, typed_config(overrides).rollout.router, False)


def test_redundant_switches_are_accepted_and_the_cli_stops_a_bad_one(tmp_path):
    validate(typed_config(["+rollout.router.extra_args.disable_health_check=true"]))
    proc, imported = run_main("+rollout.router.extra_args.disable_health_check=false", f"hydra.run.dir={tmp_path}")
    assert_stopped_in_validation(proc, imported)
    assert "rollout.router.extra_args.disable_health_check" in proc.stderr


def test_a_launched_router_holds_its_ports_until_shutdown(router, tmp_path):
    """Its HTTP and Prometheus ports are reserved under the engines' per-port locks: no engine or other router on the
    node is given them while it lives (a port only probed free once let another run's router answer for ours)."""
    host, port, prom_port, _, _ = router._launch
    assert router.url.endswith(f":{port}") and port != prom_port
    for held in (port, prom_port):
        with pytest.raises(RuntimeError, match="only 0 of 1 ports free"):
            reserve_ports(host, 1, first=held, last=held)
    spare = Router.launch(cfg=RouterConfig(), log_path=tmp_path / "spare.log")
    spare_ports = spare._launch[1:3]
    assert not {port, prom_port} & set(spare_ports)
    spare.shutdown()
