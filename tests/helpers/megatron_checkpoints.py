"""Tiny HF checkpoints of every family the megatron weight mapping covers, built by transformers."""

from __future__ import annotations

from pathlib import Path

from slime.config.schema import ModelConfig
from tests.helpers.compose import model_fields

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# family -> overrides of tiny_qwen3: tied qwen3; untied MoE; qwen2 q/k/v bias; llama untied with rope scaling
FAMILIES = {
    "qwen3": {},
    "qwen3_moe": {k: v for k, v in model_fields("tiny_qwen3_moe").items() if k != "name"},
    "qwen2": {"architecture": "qwen2", "qk_layernorm": False, "add_qkv_bias": True, "tie_word_embeddings": False},
    "llama": {
        "architecture": "llama",
        "qk_layernorm": False,
        "tie_word_embeddings": False,
        "rope_scaling": LLAMA3_SCALING,
    },
}


def tiny_config(family: str, path: str | Path, **overrides) -> ModelConfig:
    """A ModelConfig of `family` in the tiny_qwen3 shape, at `path`."""
    fields = {**model_fields("tiny_qwen3"), **FAMILIES[family], **overrides}
    return ModelConfig(**{**fields, "hf_checkpoint": str(path), "name": f"tiny_{family}"})


def make_checkpoint(family: str, root: str | Path, **overrides) -> ModelConfig:
    """Write the tiny `family` checkpoint under `root/<family>` (seeded, so bit-identical every time)."""
    from slime.assets.tiny_model import create_tiny_model

    suffix = "".join(f"_{k}{v}" for k, v in sorted(overrides.items()))
    model = tiny_config(family, Path(root) / f"{family}{suffix}", **overrides)
    create_tiny_model(model)
    return model
