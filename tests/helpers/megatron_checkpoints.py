"""Tiny HF checkpoints of every family the megatron weight mapping covers, built by transformers."""

from __future__ import annotations

from pathlib import Path

import torch

from slime.config.schema import ModelConfig
from tests.helpers.compose import model_fields

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# family -> overrides of tiny_qwen3: tied qwen3; untied MoE; qwen2 q/k/v bias; GLM-4.5 MoE (a dense first layer,
# sigmoid router with expert bias, shared expert); DeepSeek-V3 (GLM-4.5's MoE over two groups, latent attention);
# llama untied with rope scaling
FAMILIES = {
    "qwen3": {},
    "qwen3_moe": {k: v for k, v in model_fields("tiny_qwen3_moe").items() if k != "name"},
    "qwen2": {"architecture": "qwen2", "qk_layernorm": False, "add_qkv_bias": True, "tie_word_embeddings": False},
    "glm4_moe": {k: v for k, v in model_fields("tiny_glm4_moe").items() if k != "name"},
    "deepseek_v3": {k: v for k, v in model_fields("tiny_deepseek_v3").items() if k != "name"},
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


def with_random_expert_bias(model: ModelConfig, seed: int = 0) -> None:
    """Give every router of `model`'s checkpoint a random expert-score bias (created at 0, as transformers
    initialises it), so that a check exercises the bias: it changes which experts are chosen, not their weights. A
    checkpoint without one (no such router, or every layer dense) is left as it is."""
    from safetensors.torch import load_file, save_file

    path = Path(model.hf_checkpoint) / "model.safetensors"
    tensors = load_file(path)
    generator = torch.Generator().manual_seed(seed)
    biases = sorted(name for name in tensors if name.endswith("mlp.gate.e_score_correction_bias"))
    for name in biases:
        tensors[name] = torch.rand(tensors[name].shape, generator=generator, dtype=tensors[name].dtype) * 0.2
    if biases:
        save_file(tensors, path, metadata={"format": "pt"})
