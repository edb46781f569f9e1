"""A vision-language checkpoint's image inputs: its image processor, the prompt's image tokens, 3D positions.

A rendered prompt holds one `<|image_pad|>` per image; the model reads `grid_t * grid_h * grid_w / merge²` of them
for an image whose patch grid the image processor chose. `expand_image_pads` repeats each pad so, as
transformers' `Qwen2_5_VLProcessor.__call__` does (`processing_qwen2_5_vl.py`), and the rollout sends the expanded
ids (SGLang takes them so with `image_data`). The image processor is transformers' own, read from the checkpoint's
`preprocessor_config.json` with its PIL backend (the engine and the trainer compute the same pixels whether or not
torchvision is installed).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoImageProcessor

from slime.vision.images import load_image


@dataclass(frozen=True)
class ImageTokens:
    """A checkpoint's image token ids (config.json) and the merger's fold (`spatial_merge_size`)."""

    image_pad: int
    vision_start: int
    merge: int

    @classmethod
    def of_checkpoint(cls, path: str | Path) -> ImageTokens | None:
        """The ids of a vision-language checkpoint; None for a text model."""
        config = json.loads((Path(path) / "config.json").read_text())
        vision = config.get("vision_config")
        if vision is None:
            return None
        return cls(
            image_pad=int(config["image_token_id"]),
            vision_start=int(config["vision_start_token_id"]),
            merge=int(vision.get("spatial_merge_size", 2)),
        )


@dataclass
class PixelInputs:
    """The image processor's output for one prompt's images, in order.

    pixel_values: Tensor[P, C * temporal_patch * patch²] float32, P = Σ grid_t grid_h grid_w patches;
    image_grid_thw: Tensor[n, 3] int64, each image's patch grid.
    """

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor

    def tokens_per_image(self, merge: int) -> list[int]:
        return [int(n) for n in (self.image_grid_thw.prod(-1) // merge**2).tolist()]

    @staticmethod
    def cat(parts: list[PixelInputs]) -> PixelInputs:
        return PixelInputs(torch.cat([p.pixel_values for p in parts]), torch.cat([p.image_grid_thw for p in parts]))


@functools.cache
def image_processor(path: str):
    """The checkpoint's image processor (transformers', PIL backend)."""
    return AutoImageProcessor.from_pretrained(path, backend="pil")


def pixel_inputs(path: str, refs: list[str]) -> PixelInputs:
    """The pixels of the images `refs` name, as the checkpoint at `path` processes them."""
    out = image_processor(path)(images=[load_image(ref) for ref in refs], return_tensors="pt")
    return PixelInputs(out["pixel_values"].float(), out["image_grid_thw"].long())


def expand_image_pads(ids: list[int], tokens_per_image: list[int], image_pad: int) -> list[int]:
    """`ids` with its i-th `image_pad` repeated `tokens_per_image[i]` times; ValueError when the prompt holds
    another number of image pads than images."""
    found = ids.count(image_pad)
    if found != len(tokens_per_image):
        raise ValueError(f"the prompt holds {found} image placeholders for {len(tokens_per_image)} images")
    out, images = [], iter(tokens_per_image)
    for token in ids:
        out.extend([token] * next(images) if token == image_pad else [token])
    return out
