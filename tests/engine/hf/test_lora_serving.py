"""The hf engine serves a LoRA adapter as SGLang does: a real server process, the adapter pushed by tensors (the
flattened bucket) or from a peft directory, and its log-probs against peft's own forward of the same adapter."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from slime.config.schema_lora import LoRAConfig
from slime.engine import http_client
from slime.engine.base import EngineLaunch, LoRAServing, get_engine_class
from slime.engine.http_client import EngineHTTPError
from slime.sync.tensor import packed
from slime.train.fsdp import lora as train_lora
from slime.wire import bucket_codec

PROMPT = [1, 5, 11, 16, 28]
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
TARGETS = ("q_proj", "v_proj", "down_proj")


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    from slime.engine.hf.config import HFEngineConfig

    launch = EngineLaunch(
        rank=0,
        model_path=tiny_model_dir,
        host="127.0.0.1",
        seed=7,
        device="cpu",
        log_dir=str(tmp_path_factory.mktemp("lora_engine_logs")),
        startup_timeout_s=300,
        lora=LoRAServing(max_rank=8, target_modules=TARGETS),
    )
    server = get_engine_class("hf")(launch, HFEngineConfig(max_batch_size=8, num_threads=1, startup_timeout_s=300))
    server.launch()
    try:
        server.wait_until_ready()
        yield server
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def adapter(tiny_model_dir):
    """A rank-4 adapter with random A and B on a peft-injected copy of the model: (model, config dict, tensors)."""
    lora = LoRAConfig(rank=4, alpha=8.0, target_modules=list(TARGETS))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    train_lora.apply_lora(model, lora)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if train_lora.is_adapter(name):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    tensors = train_lora.peft_adapter_tensors(model, lora, whole=lambda t: t)
    config = train_lora.peft_config(lora).to_dict()
    config["target_modules"] = sorted(config["target_modules"])  # a set in peft's dict: JSON needs a list
    return SimpleNamespace(model=model, config=config, tensors=tensors)


def generate(url: str, **extra) -> tuple[list[int], list[float]]:
    body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True, **extra}
    reply = http_client.post(url + "/generate", body, timeout=60)
    return reply["output_ids"], [entry[0] for entry in reply["meta_info"]["output_token_logprobs"]]


def reference_log_probs(model, output_ids: list[int]) -> list[float]:
    tokens = torch.tensor([PROMPT + output_ids])
    with torch.no_grad():
        logits = model(tokens).logits[0, len(PROMPT) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(output_ids)[:, None])[:, 0].tolist()


def load_by_tensors(url: str, adapter, name: str = "policy") -> dict:
    bucket = sorted(adapter.tensors.items())
    with packed(bucket) as (flat, metadata):
        body = {
            "lora_name": name,
            "config_dict": adapter.config,
            "serialized_named_tensors": [bucket_codec.encode(flat, metadata)],
            "load_format": "flattened_bucket",
        }
        return http_client.post(url + "/load_lora_adapter_from_tensors", body, timeout=60)


def test_adapter_by_tensors_serves_peft_log_probs_and_unnamed_requests_the_base(engine, adapter, tiny_model_dir):
    base_ids, base_lps = generate(engine.url)
    reply = load_by_tensors(engine.url, adapter)
    assert reply == {"success": True, "error_message": None, "loaded_adapters": {"policy": "policy"}}

    ids, lps = generate(engine.url, lora_path="policy")
    assert ids != base_ids  # the adapter changes the greedy continuation
    assert lps == pytest.approx(reference_log_probs(adapter.model, ids), abs=2e-5)
    with train_lora.base_only(adapter.model, {}):
        assert generate(engine.url) == (base_ids, base_lps)
        assert base_lps == pytest.approx(reference_log_probs(adapter.model, base_ids), abs=2e-5)

    with pytest.raises(EngineHTTPError, match="requested LoRA adapters are not loaded: other"):
        generate(engine.url, lora_path="other")
    with pytest.raises(EngineHTTPError, match="holds one adapter"):
        load_by_tensors(engine.url, adapter, name="second")
    http_client.post(engine.url + "/unload_lora_adapter", {"lora_name": "policy"}, timeout=30)
    with pytest.raises(EngineHTTPError, match="not loaded: policy"):
        generate(engine.url, lora_path="policy")


def test_adapter_from_a_peft_directory_and_the_weight_version(engine, adapter, tmp_path):
    lora = LoRAConfig(rank=4, alpha=8.0, target_modules=list(TARGETS))
    train_lora.write_peft_adapter(adapter.tensors, lora, tmp_path / "adapter", base="tiny")
    http_client.post(
        engine.url + "/load_lora_adapter", {"lora_name": "policy", "lora_path": str(tmp_path / "adapter")}, timeout=60
    )
    reply = http_client.post(engine.url + "/update_weight_version", {"new_version": "3"}, timeout=30)
    assert reply["new_version"] == "3"
    body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True, "lora_path": "policy"}
    out = http_client.post(engine.url + "/generate", body, timeout=60)
    assert out["meta_info"]["weight_version"] == "3"
    lps = [entry[0] for entry in out["meta_info"]["output_token_logprobs"]]
    assert lps == pytest.approx(reference_log_probs(adapter.model, out["output_ids"]), abs=2e-5)
    http_client.post(engine.url + "/unload_lora_adapter", {"lora_name": "policy"}, timeout=30)


def test_adapter_that_does_not_fit_the_slot_is_refused(engine, adapter):
    too_big = dict(adapter.config, r=16)
    with pytest.raises(EngineHTTPError, match=r"rank 16 is not in \[1, --max-lora-rank 8\]"):
        load_by_tensors(engine.url, SimpleNamespace(config=too_big, tensors=adapter.tensors))
    elsewhere = dict(adapter.config, target_modules=["gate_proj"])
    with pytest.raises(EngineHTTPError, match="outside --lora-target-modules"):
        load_by_tensors(engine.url, SimpleNamespace(config=elsewhere, tensors=adapter.tensors))


def _adapter_context(adapter, mode: str, work_dir):
    """The sync context of an adapter push into the hf engine; tensor mode checks each tensor (the trainer's sha256,
    and the gains' checksums after the push)."""
    from slime.sync.base import SyncContext, SyncedAdapter

    return SyncContext(
        source_checkpoint="unused",
        engine="hf",
        work_dir=str(work_dir),
        bucket_bytes=1 << 20,
        adapter=SyncedAdapter(name="policy", config=adapter.config),
        check_weight_update_equal=mode == "tensor",
    )


@pytest.mark.parametrize("mode", ["tensor", "disk"])
def test_the_adapter_sync_pushes_the_adapter_alone_and_survives_an_engine_that_lost_it(engine, adapter, mode, tmp_path):
    """The mode's adapter sync: per push unload, load, stamp the version; the bytes are the adapter's. An engine that
    lost the adapter (restarted) refuses the unload, and the push loads it anyway; so does one that holds it for a
    sync reconnected after a restart. Disk mode keeps the served adapter's directory only, until closed."""
    from slime.sync.base import connect_weight_sync

    context = _adapter_context(adapter, mode, tmp_path)
    sync = connect_weight_sync(mode, [engine.url], context)
    assert type(sync).__name__ == f"{mode.capitalize()}AdapterSync"
    buckets = [list(adapter.tensors.items())[:3], list(adapter.tensors.items())[3:]]  # one load of both buckets
    body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True, "lora_path": "policy"}
    for version in (1, 2, 3, 4):
        if version == 3:  # the engine lost the adapter, as a restarted one has none
            http_client.post(engine.url + "/unload_lora_adapter", {"lora_name": "policy"}, timeout=30)
        if version == 4:  # a sync reconnected after another engine restarted (the trainer closes the old one)
            sync.close()
            sync = connect_weight_sync(mode, [engine.url], context)
        perf = sync.push(iter(buckets), weight_version=version)
        assert perf["perf/update_weights_bytes"] == sum(t.numel() * 4 for t in adapter.tensors.values())
        out = http_client.post(engine.url + "/generate", body, timeout=60)
        assert out["meta_info"]["weight_version"] == str(version)
        lps = [entry[0] for entry in out["meta_info"]["output_token_logprobs"]]
        assert lps == pytest.approx(reference_log_probs(adapter.model, out["output_ids"]), abs=2e-5)
    http_client.post(engine.url + "/unload_lora_adapter", {"lora_name": "policy"}, timeout=30)
    assert len(list(tmp_path.rglob("*.safetensors"))) == (mode == "disk")  # the served adapter's directory alone
    sync.close()
    assert not any(tmp_path.rglob("*.safetensors"))


def test_an_adapter_tensor_that_arrives_changed_fails_its_load(engine, adapter):
    """debug.check_weight_update_equal on an adapter sync: the engine checks each tensor against the sender's sha256
    (SGLang's expected_checksums) and refuses a changed, missing or extra one, loading nothing."""
    from slime.engine.client import EngineClient
    from slime.sync.adapter import sha256_of

    bucket = sorted(adapter.tensors.items())
    sums = sha256_of(bucket)
    changed = dict(sums, **{bucket[0][0]: "0" * 64})
    missing = {name: value for name, value in sums.items() if name != bucket[1][0]}
    client = EngineClient(engine.url)
    with packed(bucket) as (flat, metadata):  # an item per read: each read releases its reference
        for expected, says in ((changed, "1 value-diff"), (missing, "1 extra")):
            with pytest.raises(EngineHTTPError, match=f"LORA-CHECK.*{says}"):
                item = bucket_codec.encode(flat, metadata)
                client.load_lora_adapter_from_tensors("policy", adapter.config, [item], expected_checksums=expected)
        item = bucket_codec.encode(flat, metadata)
        client.load_lora_adapter_from_tensors("policy", adapter.config, [item], expected_checksums=sums)
    client.unload_lora_adapter("policy")


@pytest.mark.parametrize("mode", ["tensor", "disk"])
def test_the_adapter_sync_moves_a_trained_gain_into_the_engines_base_before_the_adapter(
    engine, adapter, mode, tmp_path
):
    """model.lora.train_params synced beside the adapter (peft's modules_to_save): each push updates the engine's
    base gain (tensor mode: in a weight-update session; disk mode: from a directory holding that tensor alone), then
    loads the adapter; the engine scores as the trainer's model with both. In tensor mode the check after the push
    compares the engine's gain with the trainer's and names one that differs."""
    from slime.engine.client import EngineClient
    from slime.sync.base import WeightMismatchError, connect_weight_sync

    context = _adapter_context(adapter, mode, tmp_path)
    sync = connect_weight_sync(mode, [engine.url], context)
    norm = adapter.model.model.norm.weight
    original = norm.detach().clone()
    body = {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True, "lora_path": "policy"}
    marks = {"tensor": "update_weights_from_tensor: Succeeded", "disk": "Succeeded to update model weights (1 tensors"}
    log = Path(engine.log_path)
    try:
        for version, scale in ((1, 1.7), (2, 0.6)):
            with torch.no_grad():
                norm.copy_(original * scale)
            pushed = [*adapter.tensors.items(), ("model.norm.weight", norm.detach().clone())]
            perf = sync.push(iter([pushed[:5], pushed[5:]]), weight_version=version)
            assert perf["perf/update_weights_bytes"] == 4 * (sum(t.numel() for t in adapter.tensors.values()) + 64)
            out = http_client.post(engine.url + "/generate", body, timeout=60)
            assert out["meta_info"]["weight_version"] == str(version)
            lps = [entry[0] for entry in out["meta_info"]["output_token_logprobs"]]
            assert lps == pytest.approx(reference_log_probs(adapter.model, out["output_ids"]), abs=2e-5)
            with torch.no_grad():  # with the checkpoint's gain the trainer's model would score otherwise
                norm.copy_(original)
                stale = reference_log_probs(adapter.model, out["output_ids"])
                norm.copy_(original * scale)
            assert lps != pytest.approx(stale, abs=1e-3)
        text = log.read_text()
        # each push: the gain first, then the adapter
        assert text.count(marks[mode]) >= 2 and text.rindex(marks[mode]) < text.rindex("load_lora_adapter")
        if mode == "disk":
            served = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.safetensors"))
            assert served == [
                "weights/adapter_v000002/adapter_model.safetensors",
                "weights/adapter_v000002/trained_params/model.safetensors",
            ]
        else:  # the engine's gain changed behind the sync's back: the check names it
            (tmp_path / "other").mkdir()
            save_file({"model.norm.weight": original * 5}, str(tmp_path / "other" / "model.safetensors"))
            EngineClient(engine.url).update_weights_from_disk(str(tmp_path / "other"))
            with pytest.raises(WeightMismatchError, match=r"trained base weights \['model.norm.weight'\] differ"):
                sync.check_pushed()
    finally:
        with torch.no_grad():
            norm.copy_(original)
        sync.push(iter([[*adapter.tensors.items(), ("model.norm.weight", original)]]), weight_version=9)
        http_client.post(engine.url + "/unload_lora_adapter", {"lora_name": "policy"}, timeout=30)
        sync.close()


@pytest.mark.parametrize("mode", ["tensor", "disk"])
def test_a_verified_adapter_sync_finds_an_adapter_that_never_arrived_or_arrived_changed(
    engine, adapter, mode, tmp_path, monkeypatch
):
    """`rollout.weight_sync.verify`: after each adapter push the engine's slot must hold the pushed tensors. A load
    request lost on the way (the engine then holds none, or the previous adapter when the unload was lost too) and a
    byte flipped after the trainer hashed the adapter both fail the push naming the adapter and its tensors."""
    import dataclasses

    from slime.engine.client import EngineClient
    from slime.sync.base import WeightMismatchError, connect_weight_sync
    from tests.helpers.planted_faults import planted

    context = dataclasses.replace(
        _adapter_context(adapter, mode, tmp_path), check_weight_update_equal=False, verify=True
    )
    sync = connect_weight_sync(mode, [engine.url], context)
    pushed = list(adapter.tensors.items())
    load = {"tensor": "load_lora_adapter_from_tensors", "disk": "load_lora_adapter"}[mode]
    try:
        assert sync.push(iter([pushed]), weight_version=1)["perf/update_weights_verify_time"] > 0
        with monkeypatch.context() as patch:
            patch.setattr(EngineClient, load, lambda *a, **k: {"success": True})
            with pytest.raises(
                WeightMismatchError, match=rf"{engine.url}.*adapter 'policy' is not loaded \(12 tensors pushed\)"
            ):
                sync.push(iter([pushed]), weight_version=2)
            patch.setattr(EngineClient, "unload_lora_adapter", lambda *a, **k: {"success": True})
        sync.push(iter([pushed]), weight_version=3)
        changed = [(n, t * 2 if i == 0 else t) for i, (n, t) in enumerate(pushed)]
        with monkeypatch.context() as patch:  # a new adapter's load and the old one's unload both lost
            patch.setattr(EngineClient, load, lambda *a, **k: {"success": True})
            patch.setattr(EngineClient, "unload_lora_adapter", lambda *a, **k: {"success": True})
            with pytest.raises(
                WeightMismatchError, match=rf"{pushed[0][0]} \(adapter 'policy': the engine holds another"
            ):
                sync.push(iter([changed]), weight_version=4)
        flipped_name = pushed[1][0]
        with planted(monkeypatch, flip=flipped_name), pytest.raises(WeightMismatchError, match=flipped_name):
            sync.push(iter([pushed]), weight_version=5)
    finally:
        sync.close()
        http_client.request("POST", engine.url + "/unload_lora_adapter", {"lora_name": "policy"}, timeout=30)
