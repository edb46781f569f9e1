"""Deterministic creation of a small randomly initialised HF model of a configured shape."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from slime.assets.files import creation_lock
from slime.assets.made import is_current
from slime.assets.tokenizer import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START, build_tokenizer, vocabulary
from slime.config.schema import ModelConfig
from slime.models.families import hf_fields


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
    vision = model.vision is not None
    if len(vocabulary(vision=vision)) > model.vocab_size:
        raise ValueError(
            f"model.vocab_size={model.vocab_size} is smaller than the tokenizer's {len(vocabulary(vision=vision))} tokens"
        )
    tmp_dir = save_dir.with_name(save_dir.name + ".tmp")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)
    tokenizer = build_tokenizer(tmp_dir, vision=vision)
    config_fields = hf_config_dict(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    if vision:
        config_fields.update(_vision_token_ids(tokenizer))
        _save_image_processor(model, tmp_dir)
    (tmp_dir / "config.json").write_text(json.dumps(config_fields, indent=2))
    hf_config = AutoConfig.from_pretrained(str(tmp_dir))
    with torch.random.fork_rng():
        torch.manual_seed(model.init_seed)
        auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
        net = auto.from_config(hf_config, dtype=torch.float32)
    net.generation_config.eos_token_id = tokenizer.eos_token_id
    net.generation_config.pad_token_id = tokenizer.pad_token_id
    net.save_pretrained(str(tmp_dir), safe_serialization=True)
    shutil.rmtree(save_dir, ignore_errors=True)  # a stale generated model (other shape or seed)
    tmp_dir.rename(save_dir)
    return save_dir


# the tiny vision model's images: 56² to 112² pixels (4 to 16 image tokens); larger ones are scaled down
TINY_MIN_PIXELS, TINY_MAX_PIXELS = 56 * 56, 112 * 112


def _vision_token_ids(tokenizer) -> dict[str, int]:
    """config.json's image token ids, as the tokenizer spells them."""
    ids = tokenizer.convert_tokens_to_ids
    return {
        "image_token_id": ids(IMAGE_PAD),
        "video_token_id": ids(VIDEO_PAD),
        "vision_start_token_id": ids(VISION_START),
        "vision_end_token_id": ids(VISION_END),
    }


def _save_image_processor(model: ModelConfig, save_dir: Path) -> None:
    """preprocessor_config.json: transformers' Qwen2-VL image processor for the tower's patches."""
    vision = model.vision
    processor = Qwen2VLImageProcessorPil(
        min_pixels=TINY_MIN_PIXELS,
        max_pixels=TINY_MAX_PIXELS,
        patch_size=vision.patch_size,
        temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size,
    )
    processor.save_pretrained(str(save_dir))
