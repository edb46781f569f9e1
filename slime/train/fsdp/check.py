"""Validation of the fsdp backend's config: the checks of its registry record (slime.registry.TRAIN_BACKENDS),
run by slime/plan/validate.py before anything starts. No torch at import."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.train.fsdp.config import FSDPOptions

MIXED_PRECISION_MODES = ("fsdp2", "autocast")


def check(cfg: RunConfig) -> Iterator[Problem]:
    """The fsdp backend splits by data and tensor parallelism; tp must divide the split dimensions."""
    p = cfg.parallelism
    for key in ("pp", "cp", "ep", "etp"):
        if getattr(p, key) != 1:
            yield Problem(
                f"parallelism.{key}",
                getattr(p, key),
                "the fsdp backend splits models by data and tensor parallelism only",
                f"set parallelism.{key}=1 or parallelism=megatron",
            )
    m = cfg.model
    for key in ("num_attention_heads", "num_query_groups", "ffn_hidden_size"):
        if p.tp > 1 and getattr(m, key) % p.tp:
            yield Problem(
                "parallelism.tp",
                p.tp,
                f"tensor parallelism splits model.{key}={getattr(m, key)} evenly over the tp ranks",
                f"pick a parallelism.tp dividing {getattr(m, key)}",
            )
    if p.sequence_parallel:
        yield Problem(
            "parallelism.sequence_parallel",
            True,
            "sequence parallelism needs tensor parallelism (megatron)",
            "set parallelism.sequence_parallel=false",
        )
    if m.lora.enabled:
        yield from _check_lora(cfg)
    if p.fp8:
        yield from _check_fp8(cfg)
    if p.fsdp.mixed_precision not in MIXED_PRECISION_MODES:
        yield Problem(
            "parallelism.fsdp.mixed_precision",
            p.fsdp.mixed_precision,
            f"unknown mode; expected one of {', '.join(MIXED_PRECISION_MODES)}",
            "set parallelism.fsdp.mixed_precision=fsdp2 (bf16 compute over fp32 shards) or autocast",
        )


def _check_lora(cfg: RunConfig) -> Iterator[Problem]:
    """The layouts whose adapters this backend does not split (slime.train.fsdp.lora)."""
    rank = cfg.model.lora.rank
    if cfg.parallelism.tp > 1:
        yield Problem(
            "model.lora.rank",
            rank,
            f"LoRA adapters are not split over tensor-parallel ranks yet (parallelism.tp={cfg.parallelism.tp})",
            "set parallelism.tp=1, or model.lora.rank=0",
        )
    if cfg.model.num_experts:
        yield Problem(
            "model.lora.rank",
            rank,
            "adapters on MoE experts are not supported (model.num_experts is set)",
            "set model.lora.rank=0, or train a dense model",
        )


def _check_fp8(cfg: RunConfig) -> Iterator[Problem]:
    """torchao's float8 training (slime.train.fsdp.float8) on what it converts: dense linears of one whole model."""
    if importlib.util.find_spec("torchao") is None:
        yield Problem(
            "parallelism.fp8",
            True,
            "FP8 training on the fsdp backend uses torchao's float8 training, and torchao is not installed",
            "pip install -e '.[fp8]' (torchao), or set parallelism.fp8=false",
        )
    m, p = cfg.model, cfg.parallelism
    refused = [  # (refused, what, the key and its value)
        (m.lora.enabled, "LoRA adapters over a float8 base are not supported", f"model.lora.rank={m.lora.rank}"),
        (m.num_experts, "a MoE model's experts are not linears torchao converts", f"model.num_experts={m.num_experts}"),
        (p.tp > 1, "float8 linears are not split over tensor-parallel ranks here", f"parallelism.tp={p.tp}"),
    ]
    for present, why, setting in refused:
        if present:
            yield Problem("parallelism.fp8", True, f"{why} ({setting})", "set parallelism.fp8=false")


def check_unchosen(cfg: RunConfig) -> Iterator[Problem]:
    """Another backend is chosen: the fsdp options would be ignored."""
    p = cfg.parallelism
    if p.fsdp != FSDPOptions():
        yield Problem(
            "parallelism.fsdp",
            p.fsdp,
            f"options of the fsdp backend, but parallelism.backend={p.backend!r}",
            "remove the parallelism.fsdp.* overrides, or use parallelism=fsdp",
        )
