"""The model the weight-sync benches push and digest (tools/bench_sync.py, tools/bench_digests.py): the
Qwen3-1.7B shape (or a tiny one) as HF-named random bf16 tensors, cut into buckets as the trainer's exporters cut
them (`slime.wire.tensors.in_buckets`), the HF directory an engine starts from, and the timing both benches share:
the median of repeated calls, and the copy floor (one device copy of the same bytes)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from slime.assets.tiny_model import hf_config_dict
from slime.assets.tokenizer import build_tokenizer
from slime.config.schema import ModelConfig
from slime.wire.hf_dir import write_hf_dir
from slime.wire.tensors import Bucket, in_buckets

QWEN3_1P7B = dict(
    num_layers=28, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=16, num_query_groups=8, kv_channels=128
)
TINY = dict(
    num_layers=4, hidden_size=256, ffn_hidden_size=768, num_attention_heads=4, num_query_groups=2, kv_channels=64
)


def model_config(tiny: bool, out_dir: Path) -> ModelConfig:
    shape = TINY if tiny else QWEN3_1P7B
    return ModelConfig(
        name="bench", hf_checkpoint=str(out_dir), vocab_size=4096 if tiny else 151936, tie_word_embeddings=True, **shape
    )


def random_weights(model: ModelConfig, device: torch.device, seed: int) -> list[tuple[str, torch.Tensor]]:
    """HF-named bf16 tensors of the model's shape (names and shapes from transformers on the meta device)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    fields = hf_config_dict(model, eos_token_id=0, pad_token_id=0)
    fields.pop("architectures")
    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(Qwen3Config(**fields), dtype=torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(seed)
    return [
        (name, (torch.randn(p.shape, generator=gen, device=device, dtype=torch.float32) * 0.02).to(torch.bfloat16))
        for name, p in net.named_parameters()
    ]


def bucketed(named: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[Bucket]:
    """The buckets of at least `bucket_bytes` an exporter hands a push (the last may be smaller)."""
    return list(in_buckets(named, bucket_bytes))


def write_model_dir(model: ModelConfig, named, out_dir: Path) -> None:
    """An HF directory the engine starts from: config, tokenizer and (these) weights."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    config = hf_config_dict(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    write_hf_dir(bucketed(named, 1 << 30), out_dir, source_checkpoint=out_dir)


def sync_floor(named, device: torch.device, repeats: int) -> float:
    """Seconds for one in-process copy of every tensor's bytes into one device buffer (median)."""
    total = sum(t.numel() * t.element_size() for _, t in named)
    dst = torch.empty(total, dtype=torch.uint8, device=device)

    def copy_all() -> None:
        offset = 0
        for _, t in named:
            n = t.numel() * t.element_size()
            dst[offset : offset + n].copy_(t.reshape(-1).view(torch.uint8))
            offset += n

    return median_seconds(copy_all, device, repeats)


def copies_floor(named, bucket_bytes: int, device: torch.device, repeats: int) -> float:
    """Seconds for the two copies a tensor-mode push makes, in one process with no hand-over (median): each bucket
    packed into a fresh staging buffer as the trainer packs it (`slime.sync.tensor.packed`), then copied out of its
    views into tensors of the model's shapes as the engine loads it (`slime.engine.hf.weights.copy_all`)."""
    from slime.engine.hf.weights import copy_all
    from slime.sync.tensor import packed
    from slime.wire.bucket_codec import reconstruct

    buckets = bucketed(named, bucket_bytes)
    targets = [[torch.empty_like(t) for _, t in bucket] for bucket in buckets]

    def both_copies() -> None:
        for bucket, into in zip(buckets, targets):
            with packed(bucket) as (flat, metadata):
                copy_all(list(zip(into, (view for _, view in reconstruct(flat, metadata)))))

    return median_seconds(both_copies, device, repeats)


def median_seconds(run: Callable[[], object], device: torch.device, repeats: int) -> float:
    """The median seconds of `repeats` calls of `run`, each until the device is done, after one that warms up."""
    times = []
    for _ in range(repeats + 1):
        _synchronize(device)
        start = time.perf_counter()
        run()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
