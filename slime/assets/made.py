"""Whether a model the run makes on first use is made already, read from its directory's files alone (no torch,
no transformers): the driver asks this of every run, and most runs find their model there."""

from __future__ import annotations

import json
from pathlib import Path

from slime.assets.hf_config_file import read_hf_config
from slime.assets.tokenizer_spec import chat_template, vocabulary
from slime.config.schema import ModelConfig
from slime.models.families import mismatches
from slime.models.hf_vision import text_fields

SOURCE_FILE = "slime_import.json"  # beside config.json: the GGUF file the directory was imported from


def is_made(model: ModelConfig) -> bool:
    """True when `model.hf_checkpoint` holds the model its option makes (generated, or imported from GGUF)."""
    return is_current(model, model.hf_checkpoint) if model.import_gguf is None else is_imported(model)


def is_current(model: ModelConfig, save_dir: str | Path) -> bool:
    """True when `save_dir` holds a model generated from exactly this config (shape, init std and seed) with
    today's tokenizer (its vocabulary and chat template: a model made by an older version is made again, with the
    same weights)."""
    if not (Path(save_dir) / "config.json").exists() or not (Path(save_dir) / "model.safetensors").exists():
        return False
    actual = read_hf_config(save_dir)
    text = text_fields(actual)  # a vision-language model's are in text_config
    return (
        not mismatches(model, actual)
        and text.get("initializer_range") == model.init_std
        and text.get("slime_init_seed") == model.init_seed
        and has_current_tokenizer(Path(save_dir), vision=model.vision is not None)
    )


def has_current_tokenizer(save_dir: Path, *, vision: bool = False) -> bool:
    """Whether the tokenizer saved in `save_dir` has slime.assets.tokenizer_spec's vocabulary and chat template (a
    vision model's, with `vision`)."""
    try:
        vocab = json.loads((save_dir / "tokenizer.json").read_text())["model"]["vocab"]
        template = (save_dir / "chat_template.jinja").read_text()
    except (OSError, ValueError, KeyError):
        return False
    expected = {token: i for i, token in enumerate(vocabulary(vision=vision))}
    return vocab == expected and template == chat_template(vision=vision)


def is_imported(model: ModelConfig) -> bool:
    """True when `model.hf_checkpoint` holds the weights imported from `model.import_gguf`'s file."""
    record = Path(model.hf_checkpoint) / SOURCE_FILE
    if not record.exists() or not (Path(model.hf_checkpoint) / "model.safetensors").exists():
        return False
    return json.loads(record.read_text()).get("gguf_file") == Path(model.import_gguf).name
