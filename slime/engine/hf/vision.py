"""A request's images on the hf engine: pixels from the references it carries (SGLang's `image_data`), checked
against the image tokens of its `input_ids`, and its multimodal RoPE positions.

The rollout sends the prompt's ids with each image's placeholder already repeated once per image token (as the
model's processor expands it); a request whose ids hold another number of image tokens than its images make is
refused (HTTP 400), as SGLang refuses a prompt whose placeholders do not match its images.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slime.engine.hf.request import GenerationError
from slime.vision.images import ImageError
from slime.vision.processor import (
    ImageTokens,
    PixelInputs,
    mrope_positions,
    pixel_inputs,
    prompt_image_mask,
    rope_index,
)


@dataclass
class VisionPrompt:
    """A prompt's images as the model takes them: pixels, positions Tensor[3, L] int64, and `delta`, the next
    text position minus L (the image tokens share positions)."""

    pixels: PixelInputs
    positions: torch.Tensor
    delta: int


class EngineVision:
    """The image side of a vision-language checkpoint served by the engine."""

    def __init__(self, model, checkpoint: str, tokens: ImageTokens):
        self.checkpoint = checkpoint
        self.tokens = tokens
        self.get_rope_index = rope_index(model)

    @classmethod
    def of_checkpoint(cls, model, checkpoint: str) -> EngineVision | None:
        tokens = ImageTokens.of_checkpoint(checkpoint)
        return None if tokens is None else cls(model, checkpoint, tokens)

    def prompt(self, input_ids: list[int], refs: list[str]) -> VisionPrompt:
        """The request's images; GenerationError when one cannot be read or the ids hold another token count."""
        try:
            pixels = pixel_inputs(self.checkpoint, refs)
        except ImageError as exc:
            raise GenerationError(f"image_data: {exc}") from None
        wanted = sum(pixels.tokens_per_image(self.tokens.merge))
        found = input_ids.count(self.tokens.image_pad)
        if wanted != found:
            raise GenerationError(
                f"input_ids hold {found} image tokens (id {self.tokens.image_pad}); the {len(refs)} images of "
                f"image_data make {wanted}: expand each placeholder by its image's token count"
            )
        mask = prompt_image_mask(input_ids, len(input_ids), self.tokens.image_pad)
        positions, delta = mrope_positions(self.get_rope_index, input_ids, pixels, mask)
        return VisionPrompt(pixels, positions, delta)
