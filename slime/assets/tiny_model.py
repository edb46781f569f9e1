"""Deterministic creation of a small randomly initialised HF model of a configured shape."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from slime.assets.files import creation_lock
from slime.assets.made import is_current
from slime.assets.tokenizer import build_tokenizer, vocabulary
from slime.config.hf_config import hf_fields
from slime.config.schema import ModelConfig


def hf_config_dict(model: ModelConfig, *, eos_token_id: int | None, pad_token_id: int | None) -> dict:
    """The transformers `config.json` fields for `model` (any `model.architecture`)."""
    return hf_fields(model, eos_token_id=eos_token_id, pad_token_id=pad_token_id)


def ensure_tiny_model(model: ModelConfig) -> bool:
    """Create `model.hf_checkpoint` unless it already holds exactly this model; True when it was created.

    Runs that start together (a sweep's jobs) make it once: the check is repeated under a lock, so a model
    another run has just written, and may be reading, is never replaced.
    """
    if is_current(model, model.hf_checkpoint):
        return False
    with creation_lock(model.hf_checkpoint):
        if is_current(model, model.hf_checkpoint):
            return False
        create_tiny_model(model)
        return True


def create_tiny_model(model: ModelConfig, save_dir: str | Path | None = None) -> Path:
    """Write tokenizer + randomly initialised weights (seeded by `model.init_seed`) to `save_dir`.

    The same config and seed give bit-identical safetensors on every machine. Written to a temporary
    sibling directory first and renamed, so an interrupted creation never leaves a half model behind.
    """
    save_dir = Path(save_dir or model.hf_checkpoint)
    if len(vocabulary()) > model.vocab_size:
        raise ValueError(
            f"model.vocab_size={model.vocab_size} is smaller than the tokenizer's {len(vocabulary())} tokens"
        )
    tmp_dir = save_dir.with_name(save_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    tokenizer = build_tokenizer(tmp_dir)
    config_fields = hf_config_dict(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    (tmp_dir / "config.json").write_text(json.dumps(config_fields, indent=2))
    hf_config = AutoConfig.from_pretrained(str(tmp_dir))
    with torch.random.fork_rng():
        torch.manual_seed(model.init_seed)
        net = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    net.generation_config.eos_token_id = tokenizer.eos_token_id
    net.generation_config.pad_token_id = tokenizer.pad_token_id
    net.save_pretrained(str(tmp_dir), safe_serialization=True)
    shutil.rmtree(save_dir, ignore_errors=True)  # a stale generated model (other shape or seed)
    tmp_dir.rename(save_dir)
    return save_dir
