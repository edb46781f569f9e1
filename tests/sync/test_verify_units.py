"""slime.sync.verify and slime.sync.push_ledger on their own: the trainer's ledger against engines that report what they hold (in-process stand-ins
returning `EngineDigests` of the tensors they hold), for the layouts and dtypes real engines use; the real engines'
reports are tested in tests/sync/test_verified_sync.py, tests/engine/vllm and tests/engine/hf."""

from __future__ import annotations

import pytest
import torch

from slime.engine.client import SGLANG_CPU_HASH, EngineClient, EngineDigests
from slime.sync import push_ledger
from slime.sync.push_ledger import SERVING_DTYPES, PushLedger, digests_of
from slime.sync.verify import Verifier, WeightMismatchError
from slime.wire import weight_digest


class Holding(EngineClient):
    """An engine holding `tensors` ({its name: tensor}), reporting them as the built-in engine does."""

    digest_hash = weight_digest.DIGEST

    def __init__(self, tensors: dict[str, torch.Tensor], url: str = "http://engine:1"):
        super().__init__(url)
        self.tensors = tensors

    def weight_digests(self, timeout: float = 600.0) -> EngineDigests:
        names = list(self.tensors)
        return EngineDigests(
            hash=self.digest_hash, tensors=dict(zip(names, digests_of(list(self.tensors.values()), self.digest_hash)))
        )


class FusedHolding(Holding):
    """As vLLM holds them: q/k/v fused, the embedding padded to 64 rows; SGLang's hash for variety."""

    digest_hash = SGLANG_CPU_HASH
    packed_modules = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}
    vocab_padding = 64


def weights(seed: int = 0, dtype=torch.float32) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    names = [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
    ]
    names += ["model.layers.0.self_attn.v_proj.weight", "model.norm.weight"]
    shapes = [(80, 8), (8, 8), (4, 8), (4, 8), (8,)]
    return {n: torch.randn(s, generator=gen).to(dtype) for n, s in zip(names, shapes)}


def push(verifier: Verifier, engines, tensors: dict[str, torch.Tensor], version: str = "1"):
    ledger = verifier.ledger(engines)
    for _ in ledger.watch([list(tensors.items())[:2], list(tensors.items())[2:]]):
        pass
    return verifier.check(engines, ledger, version)


def test_the_engines_dtype_is_learnt_from_tensors_that_tell_it_apart(tmp_path):
    verifier = Verifier(source_checkpoint=str(tmp_path), adapter=None)
    pushed = {"model.norm.weight": torch.ones(8)}  # fp32 ones and bf16 ones have the same 16-bit halves' sums
    engine = Holding({"model.norm.weight": torch.ones(8, dtype=torch.bfloat16)})
    push(verifier, [engine], pushed)
    assert set(verifier.dtypes) == {torch.float32, torch.bfloat16}  # ambiguous: both kept
    trained = {"model.norm.weight": torch.linspace(0.5, 1.5, 8)}
    engine.tensors = {"model.norm.weight": trained["model.norm.weight"].to(torch.bfloat16)}
    push(verifier, [engine], trained, "2")
    assert verifier.dtypes == (torch.bfloat16,)


def test_a_fused_padded_layout_matches_and_names_the_parts_of_what_differs(tmp_path):
    (tmp_path / "config.json").write_text('{"tie_word_embeddings": true}')
    verifier = Verifier(source_checkpoint=str(tmp_path), adapter=None)
    assert verifier.dtypes == SERVING_DTYPES
    w = weights()
    qkv = torch.cat([w[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    embedding = torch.cat([w["model.embed_tokens.weight"], torch.zeros(48, 8)])  # 80 rows padded to 128
    held = {
        "model.embed_tokens.weight": embedding,
        "lm_head.weight": embedding.clone(),  # tied, held apart
        "model.layers.0.self_attn.qkv_proj.base_layer.weight": qkv,  # wrapped for LoRA
        "model.norm.weight": w["model.norm.weight"],
        "model.layers.0.rotary.inv_freq": torch.ones(4),  # not pushed: not compared
    }
    engine = FusedHolding(held)
    assert push(verifier, [engine], w) == []
    engine.tensors["lm_head.weight"] = torch.zeros_like(embedding)
    engine.tensors["model.layers.0.self_attn.qkv_proj.base_layer.weight"] = qkv.clone().index_fill_(
        0, torch.tensor([9]), 0
    )
    with pytest.raises(WeightMismatchError) as caught:
        push(verifier, [engine], w, "2")
    text = str(caught.value)
    assert caught.value.urls == ("http://engine:1",)
    assert "lm_head.weight (tied to model.embed_tokens.weight, bucket 0: not the pushed embedding" in text
    parts = " + ".join(f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv")
    assert f"model.layers.0.self_attn.qkv_proj.base_layer.weight = {parts} (bucket 0, 1 of 2: engine " in text


def test_engines_that_cannot_report_are_returned_and_a_stranger_layout_fails(tmp_path):
    verifier = Verifier(source_checkpoint=str(tmp_path), adapter=None)

    class Sharded(Holding):
        def weight_digests(self, timeout: float = 600.0) -> EngineDigests:
            return EngineDigests(hash=self.digest_hash, tensors=None, why_not="its weights are in 2 shards")

    sharded = Sharded({})
    assert push(verifier, [sharded], weights()) == [sharded]
    with pytest.raises(WeightMismatchError, match="none of the 5 pushed tensors is among the engine's tensors"):
        push(verifier, [Holding({"transformer.h.0.weight": torch.ones(2)})], weights())


def test_the_ledger_digests_fused_parts_whichever_bucket_brings_them():
    w = weights()
    ledger = PushLedger(
        hashed=weight_digest.DIGEST, packed=FusedHolding.packed_modules, tied=False, dtypes=SERVING_DTYPES[:1]
    )
    order = ["model.layers.0.self_attn.v_proj.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.weight"]
    order += ["model.layers.0.self_attn.k_proj.weight"]
    list(ledger.watch([[(n, w[n])] for n in order]))
    ledger.wait()  # host buckets are digested once the transfer is done
    fused = ledger.pushed["model.layers.0.self_attn.qkv_proj.weight"]
    qkv = torch.cat([w[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert fused.digests == {"torch.float32": weight_digest.digests([qkv])[0]}
    assert fused.buckets == (2, 3, 0) and ledger.buckets == 4 and not ledger.fusing


def test_host_buckets_past_the_kept_budget_are_digested_beside_the_transfer_alike(monkeypatch):
    """Host buckets wait for `wait()` while their bytes stay within HOST_KEPT_BYTES; past it each is digested beside
    the next bucket's transfer, at most two buckets held (no more): the digests are the same either way."""
    w = weights()
    buckets = [list(w.items())[:2], list(w.items())[2:4], list(w.items())[4:]]

    def digested(budget: int) -> tuple[dict, list[int]]:
        monkeypatch.setattr(push_ledger, "HOST_KEPT_BYTES", budget)
        ledger = PushLedger(hashed=weight_digest.DIGEST, packed={}, tied=False, dtypes=SERVING_DTYPES[:1])
        seen = [len(ledger.pushed) for _ in ledger.watch(buckets)]  # digested when each bucket is handed on
        ledger.wait()
        return {name: p.digests for name, p in ledger.pushed.items()}, seen

    kept, kept_seen = digested(1 << 30)
    beside, beside_seen = digested(0)
    assert kept == beside and len(kept) == 5
    assert kept_seen == [0, 0, 0] and beside_seen[2] >= 2  # past the budget bucket 0 is in before bucket 2 leaves
