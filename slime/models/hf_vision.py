"""A vision-language checkpoint's `config.json` (Qwen2.5-VL) <-> `model.vision` and the language model's fields.

The language model's keys sit at the top of the file in the checkpoints published for transformers 4, and in
`text_config` in those transformers 5 writes (`text_fields` reads either). The vision tower's are in
`vision_config` under the names VISION_KEYS maps (`in_chans` in the older files, `in_channels` in the newer).
Torch-free."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from slime.config.problems import Problem
from slime.config.schema_vision import VisionConfig

VISION_KEYS = {
    "depth": "depth",
    "hidden_size": "hidden_size",
    "ffn_hidden_size": "intermediate_size",
    "num_heads": "num_heads",
    "patch_size": "patch_size",
    "temporal_patch_size": "temporal_patch_size",
    "spatial_merge_size": "spatial_merge_size",
    "window_size": "window_size",
    "fullatt_block_indexes": "fullatt_block_indexes",
    "in_channels": "in_channels",
    "num_position_embeddings": "num_position_embeddings",
    "deepstack_visual_indexes": "deepstack_visual_indexes",
}
# transformers' Qwen2.5-VL vision defaults of the keys a file may omit (its other keys are always written)
_HF_DEFAULTS = {"patch_size": 14, "window_size": 112, "in_channels": 3}


def text_fields(config: dict) -> dict:
    """The file's keys with the language model's (`text_config`, where present) over the top level; the top
    level's model_type stays."""
    inner = {k: v for k, v in (config.get("text_config") or {}).items() if k != "model_type"}
    return {**config, **inner}


def vision_fields(config: dict) -> dict[str, Any]:
    """`model.vision`'s field values read from the file's `vision_config`."""
    vision = config.get("vision_config") or {}
    fields = {ours: vision[hf] for ours, hf in VISION_KEYS.items() if hf in vision}
    if "in_chans" in vision:  # the older files' name
        fields.setdefault("in_channels", vision["in_chans"])
    return {**_HF_DEFAULTS, **fields}


def vision_mismatches(vision: VisionConfig | None, config: dict) -> list[tuple[str, Any, Any]]:
    """(model.vision.<field>, ours, the checkpoint's) for each field that differs; `model.vision` itself when one
    side has a vision tower and the other has none."""
    has_tower = "vision_config" in config
    if vision is None or not has_tower:
        return [] if vision is None and not has_tower else [("vision", vision, config.get("vision_config"))]
    theirs = vision_fields(config)
    return [
        (f"vision.{name}", getattr(vision, name), theirs[name])
        for name in VISION_KEYS
        if name in theirs and _plain(getattr(vision, name)) != _plain(theirs[name])
    ]


def _plain(value: Any) -> Any:
    """A sequence as the list a JSON file holds (a frozen config may hold a tuple)."""
    return list(value) if isinstance(value, list | tuple) else value


# the tower's activation (config.json's hidden_act) and the language model's multimodal RoPE beside mrope_section
_TOWER_ACT = {"qwen2_5_vl": "silu", "qwen3_vl": "gelu_pytorch_tanh"}
_MROPE_SPELLING = {"qwen2_5_vl": {"type": "mrope"}, "qwen3_vl": {"rope_type": "default", "mrope_interleaved": True}}


def hf_vision_config(vision: VisionConfig, out_hidden_size: int, architecture: str = "qwen2_5_vl") -> dict[str, Any]:
    """The file's `vision_config` for `model.vision` (a model made by code)."""
    fields = {
        hf: _plain(getattr(vision, ours)) for ours, hf in VISION_KEYS.items() if getattr(vision, ours) is not None
    }
    act = _TOWER_ACT[architecture]
    return {**fields, "in_chans": vision.in_channels, "out_hidden_size": out_hidden_size, "hidden_act": act}


def nested_vision_fields(text: dict[str, Any], model) -> dict[str, Any]:
    """A vision-language model's config.json as transformers 5 writes it, from the language model's fields `text`
    (hf_config.hf_fields): those in `text_config`, the tower's in `vision_config`; multimodal RoPE as the
    scaling each family's published config.json spells."""
    inner = {k: v for k, v in text.items() if k not in ("architectures", "model_type")}
    if model.rope_scaling and "mrope_section" in model.rope_scaling:
        section = list(model.rope_scaling["mrope_section"])
        inner["rope_scaling"] = {**_MROPE_SPELLING[model.architecture], "mrope_section": section}
    return {
        "architectures": text["architectures"],
        "model_type": text["model_type"],
        "text_config": {**inner, "model_type": f"{text['model_type']}_text"},
        "vision_config": hf_vision_config(model.vision, model.hidden_size, model.architecture),
        "tie_word_embeddings": text["tie_word_embeddings"],
    }


def check_vision(model, *, vision_family: bool) -> Iterator[Problem]:
    """`model.vision` against the family: a vision-language family needs its tower's shape, a text family has none
    (what a run with a vision tower needs of the other parts: slime/vision/check.py)."""
    arch = f"model.architecture={model.architecture}"
    if vision_family and model.vision is None:
        yield Problem(
            "model.vision",
            None,
            f"{arch} is a vision-language model: its vision tower's shape is needed",
            "set model.vision.* from the checkpoint's config.json vision_config (or use model=qwen2_5_vl_3b)",
        )
    elif not vision_family and model.vision is not None:
        yield Problem(
            "model.vision", "{...}", f"{arch} is a text model: it has no vision tower", "set model.vision=null"
        )
