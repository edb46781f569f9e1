"""The vision tower of a vision-language model (`model.vision`; None for a text model): Qwen2.5-VL's or Qwen3-VL's
ViT, whose field names follow its config.json's `vision_config`. Torch-free: validation and the dry run read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


@dataclass(kw_only=True)
class VisionConfig:
    """A ViT over patches of `patch_size`² pixels and `temporal_patch_size` frames (an image repeats its frame),
    `depth` blocks of `hidden_size` (attention over windows of `window_size` pixels, except the blocks in
    `fullatt_block_indexes`, which see the whole image; a SwiGLU MLP of `ffn_hidden_size`), then a merger that folds
    each `spatial_merge_size`² neighbouring patches into one token of the language model's width: an image of
    h x w pixels costs (h / patch) (w / patch) / merge² tokens of the prompt.

    Qwen3-VL's tower (architecture qwen3_vl) has no windows: every block sees the whole image, learned position
    embeddings (`num_position_embeddings` of them) join the patch embedding, the MLP is a GELU one of
    `ffn_hidden_size`, and the blocks in `deepstack_visual_indexes` also feed, each through a merger of its own, the
    first decoder layers of the language model (DeepStack)."""

    depth: int = MISSING
    hidden_size: int = MISSING
    ffn_hidden_size: int = MISSING  # config.json's intermediate_size
    num_heads: int = MISSING
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    window_size: int = 112  # pixels a windowed block's attention spans, each way
    fullatt_block_indexes: list[int] = field(default_factory=list)
    in_channels: int = 3  # config.json's in_chans
    num_position_embeddings: Optional[int] = None  # Qwen3-VL's learned position table (None: Qwen2.5-VL's tower)
    deepstack_visual_indexes: list[int] = field(default_factory=list)  # Qwen3-VL's DeepStack blocks
