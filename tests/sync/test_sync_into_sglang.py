"""Each weight-sync mode from a trained fsdp rank into the fake SGLang server, whose weight routes are SGLang
0.5.23's own deserialiser, weight updater and process-group calls (tests/fakes/fake_sglang.py): bit-exact
weights (its /weights_checker checksums against the trainer's), the version on /model_info, and the session
rule SGLang's scheduler enforces."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from slime.config.async_mode import PauseMode
from slime.engine import http_client
from slime.engine.base import LoRAServing
from slime.engine.http_client import EngineHTTPError
from slime.sync.base import SyncContext, SyncedAdapter
from slime.wire import bucket_codec
from tests.helpers.compose import LORA_ALONE
from tests.helpers.engines import generated_tokens
from tests.helpers.fake_sglang_engine import make_engine, requests_logged
from tests.helpers.fsdp_rank import (
    batches_for,
    make_backend,
    make_samples,
    make_setup,
    response_log_probs,
    train_rollout,
)
from tests.helpers.weights import engine_checksums, trainer_checksums


@pytest.fixture(scope="module")
def fakes(tiny_model_dir, tmp_path_factory):
    """A one-rank fake (distributed needs one process per rank) and a tp-2 fake (two items per tensor bucket)."""
    logs = tmp_path_factory.mktemp("fake_sglang_logs")
    one, two = make_engine(tiny_model_dir, logs / "tp1"), make_engine(tiny_model_dir, logs / "tp2", gpu_ids=("0", "1"))
    for engine in (one, two):
        engine.launch()
    try:
        for engine in (one, two):
            engine.wait_until_ready()
        yield {1: one, 2: two}
    finally:
        one.shutdown()
        two.shutdown()


@pytest.mark.parametrize("mode,tp", [("disk", 2), ("tensor", 2), ("distributed", 1)])
def test_each_mode_makes_the_fake_sglang_bit_exact(trained, fakes, tiny_model_dir, tmp_path, mode, tp):  # noqa: F811
    engine = fakes[tp]
    engine.client.update_weights_from_disk(tiny_model_dir, weight_version="0")  # back to the checkpoint
    assert engine_checksums(engine.url) != trainer_checksums(trained.model)
    context = SyncContext(source_checkpoint=tiny_model_dir, work_dir=str(tmp_path), bucket_bytes=20_000)
    trained.connect_weight_sync(mode, [engine.url], context)
    before = len(requests_logged(engine))
    try:
        trained.update_weights(weight_version=3)
    finally:
        trained.close_weight_sync()
    assert engine_checksums(engine.url) == trainer_checksums(trained.model)
    assert engine.client.get_weight_version() == "3"
    paths = [r["path"] for r in requests_logged(engine)[before:]]
    if mode != "disk":  # the buckets ran inside one session
        updates = [i for i, p in enumerate(paths) if p.startswith("/update_weights_from_")]
        assert paths.index("/begin_weight_update") < updates[0] and updates[-1] < paths.index("/end_weight_update")
    if mode == "tensor":
        items = [
            r["body"]["serialized_named_tensors"] for r in requests_logged(engine)[before:] if "tensor" in r["path"]
        ]
        # one item per TP rank, both this trainer's bucket (the fake logs the shared segment each names)
        assert items and all(len(pair) == 2 and pair[0] == pair[1] for pair in items)
        assert all(pair[0].startswith(f"/torch_{os.getpid()}_") for pair in items)


@pytest.mark.parametrize("mode,tp", [("tensor", 2), ("distributed", 1)])
def test_a_verified_push_into_the_fake_sglang_names_a_flipped_byte(
    trained, fakes, tiny_model_dir, tmp_path, monkeypatch, mode, tp
):  # noqa: F811
    """`rollout.weight_sync.verify` through SGLang's /weights_checker (its CPU hash of each tensor): a clean push
    passes; a byte flipped after the trainer hashed its bucket is named with that bucket."""
    from slime.sync.base import WeightMismatchError
    from tests.helpers.planted_faults import planted

    engine = fakes[tp]
    context = SyncContext(source_checkpoint=tiny_model_dir, work_dir=str(tmp_path), bucket_bytes=20_000, verify=True)
    trained.connect_weight_sync(mode, [engine.url], context)
    flipped = "model.layers.0.mlp.down_proj.weight"
    try:
        assert trained.update_weights(weight_version=7)["perf/update_weights_verify_time"] > 0
        with (
            planted(monkeypatch, flip=flipped),
            pytest.raises(WeightMismatchError, match=rf"version 8: {flipped} \(bucket"),
        ):
            trained.update_weights(weight_version=8)
        trained.update_weights(weight_version=9)
    finally:
        trained.close_weight_sync()
    assert engine_checksums(engine.url) == trainer_checksums(trained.model)


@pytest.mark.parametrize("mode", ["disk", "tensor", "distributed"])
def test_an_in_place_push_holds_a_running_request_which_reports_both_versions(
    trained, fakes, tiny_model_dir, tmp_path, mode
):  # noqa: F811
    """rollout.weight_sync.pause_mode=in_place: the push pauses in place, flushes no cache (SGLang refuses under
    held requests) and loads the weights while a long request is held; the request decodes on and its spans say
    which version sampled which tokens."""
    engine = fakes[1]
    engine.client.update_weights_from_disk(tiny_model_dir, weight_version="0")
    context = SyncContext(
        source_checkpoint=tiny_model_dir, work_dir=str(tmp_path), bucket_bytes=20_000, pause_mode=PauseMode.IN_PLACE
    )
    trained.connect_weight_sync(mode, [engine.url], context)
    before = len(requests_logged(engine))
    body = {"input_ids": [1, 5, 11], "sampling_params": {"max_new_tokens": 480, "ignore_eos": True}}
    try:
        with ThreadPoolExecutor(1) as pool:
            for version in (4, 5, 6):  # a push that came after the request's 480 tokens proves nothing: again
                sampled = generated_tokens(engine.url)
                answer = pool.submit(http_client.post, engine.url + "/generate", body, timeout=120)
                while generated_tokens(engine.url) < sampled + 10:  # decoding, well short of its end
                    time.sleep(0.005)
                trained.update_weights(weight_version=version)
                meta = answer.result()["meta_info"]
                if len(meta["weight_versions"]) > 1:
                    break
    finally:
        trained.close_weight_sync()
    assert engine_checksums(engine.url) == trainer_checksums(trained.model)
    spans = meta["weight_versions"]
    assert [s["version"] for s in spans] == [str(version - 1 if version > 4 else 0), str(version)]
    assert meta["weight_version"] == str(version)
    assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == 480
    logged = requests_logged(engine)[before:]
    assert {"method": "POST", "path": "/pause_generation", "body": {"mode": "in_place"}} in logged
    assert "/flush_cache" not in [r["path"] for r in logged]
    if mode == "disk":
        updates = [r["body"] for r in logged if r["path"] == "/update_weights_from_disk"]
        assert updates and all(update["flush_cache"] is False for update in updates)


def test_an_update_outside_a_session_is_refused_as_sglang_refuses_it(fakes):
    engine = fakes[1]
    flat, metadata = bucket_codec.empty_bucket()
    with pytest.raises(EngineHTTPError, match="must run between begin_weight_update\\(\\) and end_weight_update\\(\\)"):
        engine.client.update_weights_from_tensor([bucket_codec.encode(flat, metadata)], weight_version="9")
    engine.client.begin_weight_update()
    with pytest.raises(EngineHTTPError, match="already open"):
        engine.client.begin_weight_update()
    engine.client.update_weights_from_tensor([bucket_codec.encode(flat, metadata)], weight_version="9")
    engine.client.finish_weight_update("9")
    with pytest.raises(EngineHTTPError, match="no weight-update session is open"):
        engine.client.finish_weight_update("9")
    assert engine.client.get_weight_version() == "9"


def test_an_adapter_sync_serves_the_trainers_lora_adapter_in_sglang(tiny_model_dir, tmp_path):
    """model.lora synced alone into the fake SGLang at tp 2 (SGLang's LoRA request types and deserialiser, each rank
    its item), the final norm's trained gain beside it (SGLang's /update_weights_from_tensor with that tensor alone,
    in a weight-update session, before the adapter loads): after each train-then-sync round, generating with the
    adapter (`lora_path`) gives the LoRA trainer's log-probs, every rank checked the sha256 of the adapter it loaded
    and the gain's checksum was compared after the push (debug.check_weight_update_equal)."""
    trainer = make_backend(make_setup(tiny_model_dir, [*LORA_ALONE, "train.lr=0.05"]))
    lora = trainer.setup.model.lora
    engine = make_engine(
        tiny_model_dir,
        tmp_path / "logs",
        gpu_ids=("0", "1"),
        lora=LoRAServing(max_rank=8, target_modules=tuple(lora.target_modules)),
    )
    engine.start()
    adapter = SyncedAdapter(name="policy", config=lora.adapter_config())
    context = SyncContext(
        source_checkpoint=tiny_model_dir, work_dir=str(tmp_path), bucket_bytes=20_000, adapter=adapter,
        check_weight_update_equal=True,
    )  # fmt: skip
    trainer.connect_weight_sync("tensor", [engine.url], context)
    body = {"input_ids": [1, 5, 11, 16], "sampling_params": {"max_new_tokens": 6}, "return_logprob": True}
    try:
        for version in (1, 2):
            train_rollout(trainer, batches_for(make_samples(8, seed=version), dp=1, k=2)[0], rollout_id=version)
            assert trainer.update_weights(weight_version=version)["perf/update_weights_bytes"] == 4 * (19_456 + 64)
            out = http_client.post(engine.url + "/generate", {**body, "lora_path": "policy"}, timeout=60)
            assert out["meta_info"]["weight_version"] == str(version)
            engine_lp = torch.tensor([lp for lp, *_ in out["meta_info"]["output_token_logprobs"]])
            assert (response_log_probs(trainer, body["input_ids"], out["output_ids"]) - engine_lp).abs().max() < 1e-5
    finally:
        trainer.close_weight_sync()
        trainer.shutdown()
        engine.shutdown()
    logged = requests_logged(engine)
    loads = [r for r in logged if r["path"] == "/load_lora_adapter_from_tensors"]
    assert len(loads) == 2 and all(len(r["body"]["serialized_named_tensors"]) == 2 for r in loads)
    paths = [r["path"] for r in logged if r["path"] != "/weights_checker"]
    push = ["/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update", "/unload_lora_adapter"]
    push += ["/load_lora_adapter_from_tensors", "/update_weight_version", "/continue_generation"]
    assert paths == 2 * ["/pause_generation", "/flush_cache", *push], paths
    assert all(r["body"]["load_format"] == "flattened_bucket" for r in loads)
    assert all("expected_checksums" in r["body"] for r in loads)  # each rank checked the sha256 of its 28 tensors
