"""LoRA (`model.lora`): its sizes, its targets, and the backends and layouts that train adapters."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.config.schema_lora import DECODER_PROJECTIONS
from slime.registry import TRAIN_BACKENDS

LORA_INITS = ("default", "gaussian")


def check_lora(cfg: RunConfig) -> Iterator[Problem]:
    lora = cfg.model.lora
    if lora.rank < 0:
        yield Problem("model.lora.rank", lora.rank, "must be >= 0 (0: no adapters)", "set model.lora.rank=8, or 0")
    if not lora.enabled:
        return
    if lora.alpha <= 0:
        yield Problem("model.lora.alpha", lora.alpha, "must be > 0", "set model.lora.alpha=16")
    if not 0 <= lora.dropout < 1:
        yield Problem("model.lora.dropout", lora.dropout, "must be in [0, 1)", "set model.lora.dropout=0")
    if lora.init not in LORA_INITS:
        yield Problem("model.lora.init", lora.init, f"must be one of {list(LORA_INITS)}", "set model.lora.init=default")
    unknown = [name for name in lora.target_modules if name not in DECODER_PROJECTIONS]
    if unknown or not lora.target_modules:
        yield Problem(
            "model.lora.target_modules",
            list(lora.target_modules),
            f"names no decoder projection ({unknown or 'empty'}); adapters go on {list(DECODER_PROJECTIONS)}",
            "set model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        )
    backend = cfg.parallelism.backend
    if not TRAIN_BACKENDS.facts(backend).lora:
        yield Problem(
            "model.lora.rank",
            lora.rank,
            f"the {backend} backend trains no LoRA adapters yet (the fsdp backend does)",
            "set parallelism=fsdp, or model.lora.rank=0",
        )
    if cfg.parallelism.tp > 1:
        yield Problem(
            "model.lora.rank",
            lora.rank,
            f"LoRA adapters are not split over tensor-parallel ranks yet (parallelism.tp={cfg.parallelism.tp})",
            "set parallelism.tp=1, or model.lora.rank=0",
        )
    if cfg.model.num_experts:
        yield Problem(
            "model.lora.rank",
            lora.rank,
            "adapters on MoE experts are not supported (model.num_experts is set)",
            "set model.lora.rank=0, or train a dense model",
        )
