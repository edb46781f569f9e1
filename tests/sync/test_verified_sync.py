"""Verified syncs (`rollout.weight_sync.verify`) from a trained fsdp rank into a real hf engine process, in every
full-weight mode: a clean push passes and reports its cost; a byte flipped after the trainer hashed it, a tensor the
transport dropped, and a tied LM head the engine holds apart and never reloads each fail the push naming the engine,
the bucket and the tensor, and generation continues; through the built-in engine's own digests and through its
SGLang checksums."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from slime.engine import http_client
from slime.engine.http_client import EngineHTTPError
from slime.sync.base import SyncContext, WeightMismatchError
from slime.sync.push_ledger import SERVING_DTYPES
from tests.helpers.engines import start_engine
from tests.helpers.planted_faults import planted
from tests.helpers.weights import engine_checksums, trainer_checksums

PROMPT = {"input_ids": [1, 5, 11, 16], "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
MODES = ["disk", "tensor", "distributed"]
FLIPPED = "model.layers.1.mlp.up_proj.weight"
DROPPED = "model.layers.0.self_attn.k_proj.weight"


def verified(model_dir, tmp_path, engine: str = "hf") -> SyncContext:
    """A verified sync's context: `engine` "hf" compares the built-in engine's own digests (/weight_digests),
    "sglang" its SGLang checksums (/weights_checker)."""
    return SyncContext(
        source_checkpoint=model_dir, engine=engine, work_dir=str(tmp_path), bucket_bytes=20_000, verify=True
    )


def generates(url: str) -> bool:
    return len(http_client.post(url + "/generate", PROMPT, timeout=30)["output_ids"]) == 4


@pytest.mark.parametrize("dialect", ["hf", "sglang"])
@pytest.mark.parametrize("mode", MODES)
def test_a_clean_push_is_verified_and_a_corrupted_one_names_its_bucket_and_tensor(
    trained, engine, tiny_model_dir, tmp_path, monkeypatch, mode, dialect
):
    trained.connect_weight_sync(mode, [engine.url], verified(tiny_model_dir, tmp_path, dialect))
    try:
        assert trained.weight_sync.verifier.dtypes == SERVING_DTYPES  # the engine's dtype is not known yet
        perf = trained.update_weights(weight_version=1)
        # the check's seconds count the trainer's hashing beside the transfer: no bound by the push's own wall time
        assert perf["perf/update_weights_verify_time"] > 0 and perf["perf/update_weights_time"] > 0
        assert trained.weight_sync.verifier.dtypes == (torch.float32,)  # learnt: later pushes digest it alone
        assert engine_checksums(engine.url) == trainer_checksums(trained.model)
        with planted(monkeypatch, flip=FLIPPED):
            with pytest.raises(WeightMismatchError) as flipped:
                trained.update_weights(weight_version=2)
        assert flipped.value.urls == (engine.url,)
        assert (
            f"engine {engine.url} holds other weights than the trainer pushed as version 2: {FLIPPED} (bucket "
            in str(flipped.value)
        )
        assert f"{FLIPPED} (bucket " in str(flipped.value) and "engine " in str(flipped.value)
        assert generates(engine.url)  # the failed push continued generation
        trained.update_weights(weight_version=3)  # a clean push mends it
        with planted(monkeypatch, drop=DROPPED):
            trained.model.model.layers[0].self_attn.k_proj.weight.data.mul_(1.5)  # differs from what the engine holds
            try:
                # this engine's disk loader refuses a checkpoint without a tensor itself (SGLang's and vLLM's load
                # the names a directory holds: the verification finds those)
                caught = EngineHTTPError if mode == "disk" else WeightMismatchError
                named = f"missing tensors: {DROPPED}" if mode == "disk" else rf"version 4: {DROPPED} \(bucket \d+"
                with pytest.raises(caught, match=named):
                    trained.update_weights(weight_version=4)
            finally:
                trained.model.model.layers[0].self_attn.k_proj.weight.data.div_(1.5)
        assert generates(engine.url)
    finally:
        trained.close_weight_sync()


def test_a_deferred_check_runs_on_after_the_push_and_names_a_corrupted_one_once_awaited(
    trained, engine, tiny_model_dir, tmp_path, monkeypatch
):
    """`defer_verify` (on_mismatch=fail): the push returns with generation continued and its check running on the
    trainer; `weights_verified()` awaits it: its seconds, or the mismatch naming the engine and the tensor. A check
    nothing awaited is awaited by the next push, which raises its mismatch before it pauses anything."""
    context = dataclasses.replace(verified(tiny_model_dir, tmp_path), defer_verify=True)
    trained.connect_weight_sync("tensor", [engine.url], context)
    try:
        assert "perf/update_weights_verify_time" not in trained.update_weights(weight_version=1)
        assert trained.weights_verified()["perf/update_weights_verify_time"] > 0
        assert trained.weights_verified() == {}
        named = rf"engine {engine.url} holds other weights than the trainer pushed as version 2: {FLIPPED} \(bucket"
        with planted(monkeypatch, flip=FLIPPED):
            trained.update_weights(weight_version=2)
        assert generates(engine.url)
        with pytest.raises(WeightMismatchError, match=named):
            trained.weights_verified()
        with planted(monkeypatch, flip=FLIPPED):
            trained.update_weights(weight_version=2)
        with pytest.raises(WeightMismatchError, match=named):
            trained.update_weights(weight_version=3)
        trained.update_weights(weight_version=3)  # a clean push mends it
        assert trained.weights_verified()["perf/update_weights_verify_time"] > 0
        assert engine_checksums(engine.url) == trainer_checksums(trained.model)
    finally:
        trained.close_weight_sync()


def untied_copy(model_dir, out):
    """The tied checkpoint served with an LM head of its own (as a CPU vLLM serves one: slime.engine.vllm.cpu)."""
    from slime.engine.vllm.cpu import untie

    shutil.copytree(model_dir, out)
    untie(out)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    return out


@pytest.mark.parametrize("mode", ["tensor", "distributed"])  # this engine's disk loader refuses a head missing
def test_a_tied_lm_head_the_engine_holds_apart_and_does_not_reload_is_named(trained, tiny_model_dir, tmp_path, mode):
    served = untied_copy(tiny_model_dir, tmp_path / "untied")
    engine = start_engine(served, tmp_path / "logs")
    try:
        trained.connect_weight_sync(mode, [engine.url], verified(tiny_model_dir, tmp_path))
        with pytest.raises(WeightMismatchError) as caught:
            trained.update_weights(weight_version=1)
        assert (
            "lm_head.weight (tied to model.embed_tokens.weight, bucket 0: not the pushed embedding; not reloaded?)"
            in str(caught.value)
        )
        assert str(caught.value).count(" (") == 1  # the head alone
        assert generates(engine.url)
    finally:
        trained.close_weight_sync()
        engine.shutdown()


def test_a_moe_engine_reports_each_expert_so_a_flipped_expert_is_named(tmp_path_factory, monkeypatch):
    """transformers holds a MoE layer's experts fused; the built-in engine reports them one by one under their
    checkpoint names, so the verification compares every expert (and a tied head under its own name)."""
    from slime.assets.tiny_model import create_tiny_model
    from slime.config.schema import ModelConfig
    from slime.engine.hf.weights import read_safetensors_dir
    from slime.registry import WEIGHT_SYNC
    from tests.helpers.compose import model_fields

    fields = {**model_fields("tiny_qwen3_moe"), "hf_checkpoint": str(tmp_path_factory.mktemp("moe") / "tiny_qwen3_moe")}
    model_dir = str(create_tiny_model(ModelConfig(**fields)))
    checkpoint = read_safetensors_dir(model_dir)
    expert = next(n for n in sorted(checkpoint) if ".experts.1." in n)
    engine = start_engine(model_dir, tmp_path_factory.mktemp("moe_logs"))
    sync = WEIGHT_SYNC.load("tensor")([engine.client], verified(model_dir, tmp_path_factory.mktemp("moe_work")))
    try:
        reported = engine.client.weight_digests().tensors
        assert expert in reported and set(checkpoint) <= set(reported)
        sync.push(iter([list(checkpoint.items())]), weight_version=1)
        with planted(monkeypatch, flip=expert), pytest.raises(WeightMismatchError, match=rf"version 2: {expert} \("):
            sync.push(iter([list(checkpoint.items())]), weight_version=2)
    finally:
        sync.close()
        engine.shutdown()
