"""LoRA (`model.lora`): its sizes and targets (the backends refuse the layouts they cannot train: their checks)."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.config.schema_lora import DECODER_PROJECTIONS, LORA_INITS, NORM_GAIN


def check_lora(cfg: RunConfig) -> Iterator[Problem]:
    lora = cfg.model.lora
    if lora.rank < 0:
        yield Problem("model.lora.rank", lora.rank, "must be >= 0 (0: no adapters)", "set model.lora.rank=8, or 0")
    if not lora.enabled:
        return
    if cfg.model.kv_lora_rank is not None:  # its projections are not q_proj, k_proj, v_proj
        yield Problem(
            "model.lora.rank",
            lora.rank,
            f"adapters on multi-head latent attention (model.architecture={cfg.model.architecture}) are not supported",
            "set model.lora.rank=0 (full fine-tuning)",
        )
    if lora.alpha <= 0:
        yield Problem("model.lora.alpha", lora.alpha, "must be > 0", "set model.lora.alpha=16")
    if lora.lr is not None and lora.lr <= 0:
        yield Problem("model.lora.lr", lora.lr, "must be > 0 (null: train.lr)", "set model.lora.lr=null")
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
    for name in lora.train_params:
        gain = NORM_GAIN.match(name)
        if gain is None or (gain.group(2) is not None and int(gain.group(2)) >= cfg.model.num_layers):
            yield Problem(
                "model.lora.train_params",
                list(lora.train_params),
                f"{name!r} is not an RMSNorm gain of this {cfg.model.num_layers}-layer model",
                "name model.norm.weight or model.layers.<i>.input_layernorm.weight / post_attention_layernorm.weight",
            )
