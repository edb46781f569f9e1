"""Which transformers class a checkpoint loads as, and where its decoder layers are: a text model's
(`AutoModelForCausalLM`, `model.model.layers`) or a vision-language model's (`AutoModelForImageTextToText`, the
language model's layers under `model.model.language_model`, the vision tower under `model.model.visual`)."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoModelForImageTextToText


def is_vision_checkpoint(path: str | Path) -> bool:
    """Whether the checkpoint's config.json describes a vision tower."""
    return "vision_config" in json.loads((Path(path) / "config.json").read_text())


def auto_model_class(path: str | Path):
    """The transformers auto class that loads the checkpoint with its LM head."""
    return AutoModelForImageTextToText if is_vision_checkpoint(path) else AutoModelForCausalLM


def attention_for(path: str | Path, text_attention: str) -> str | dict[str, str]:
    """`attn_implementation` for `from_pretrained`: `text_attention` for the language model; a vision tower keeps
    SDPA (its attention is bidirectional within each image, never the language model's causal kind)."""
    if is_vision_checkpoint(path):
        return {"text_config": text_attention, "vision_config": "sdpa", "": "sdpa"}
    return text_attention


def decoder_layers(model):
    """The language model's decoder layers (an nn.ModuleList)."""
    inner = model.model
    return inner.language_model.layers if hasattr(inner, "language_model") else inner.layers


def text_config(config):
    """The language model's config (a vision-language config's `text_config`)."""
    return getattr(config, "text_config", None) or config
