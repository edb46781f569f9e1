"""One sequence's images as a vision-language model takes them, the same in the engine and the trainer: the pixels,
the multimodal RoPE positions (transformers' `get_rope_index`), and which tokens the image features fill.

Those tokens are the prompt's image pads: a response may hold the pad id as a sampled token, which the engine fed as
text (its decode steps carry no pixels), so the trainer places the features by this mask (`images_at`), not by the
model's own rule (every pad id).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from slime.vision.processor import ImageTokens, PixelInputs, pixel_inputs


class ImageTokenCountError(ValueError):
    """A sequence's prompt holds another number of image tokens than its images make."""

    def __init__(self, found: int, wanted: int, images: int):
        self.found, self.wanted, self.images = found, wanted, images
        super().__init__(f"the prompt holds {found} image tokens; its {images} images make {wanted}")


@dataclass
class SequenceImages:
    """pixels: the images' (None for a text sequence); positions: Tensor[3, L] int64, multimodal RoPE's temporal,
    height and width position of each token; mask: Tensor[L] bool, the tokens the image features fill; delta: the
    next text position minus L (image tokens share positions, so delta <= 0)."""

    pixels: PixelInputs | None
    positions: torch.Tensor
    mask: torch.Tensor
    delta: int

    @classmethod
    def text(cls, length: int) -> SequenceImages:
        """A sequence without images: every axis 0..L-1."""
        return cls(None, torch.arange(length).expand(3, -1), torch.zeros(length, dtype=torch.bool), 0)


class ModelImages:
    """The image side of a vision-language model (its checkpoint's image processor and token ids, and the model's
    `get_rope_index`)."""

    def __init__(self, model, checkpoint: str, tokens: ImageTokens):
        self.checkpoint = checkpoint
        self.tokens = tokens
        self.get_rope_index = _owner(model, "get_rope_index").get_rope_index

    @classmethod
    def of_checkpoint(cls, model, checkpoint: str) -> ModelImages | None:
        tokens = ImageTokens.of_checkpoint(checkpoint)
        return None if tokens is None else cls(model, checkpoint, tokens)

    def sequence(self, ids: list[int], refs: list[str], *, prompt_length: int) -> SequenceImages:
        """The images of the sequence `ids` whose first `prompt_length` tokens are its prompt. ImageError when an
        image cannot be read; ImageTokenCountError when the prompt's image pads are not the images' tokens."""
        pixels = pixel_inputs(self.checkpoint, refs)
        mask = torch.tensor(ids) == self.tokens.image_pad
        mask[prompt_length:] = False
        wanted = sum(pixels.tokens_per_image(self.tokens.merge))
        if int(mask.sum()) != wanted:
            raise ImageTokenCountError(int(mask.sum()), wanted, len(refs))
        grid = pixels.image_grid_thw
        positions, delta = self.get_rope_index(torch.tensor([ids]), mask.int().unsqueeze(0), image_grid_thw=grid)
        return SequenceImages(pixels, positions[:, 0].cpu(), mask, int(delta.reshape(-1)[0]))


def _owner(model, method: str):
    """The module of `model` that has `method` (wrappers such as peft or FSDP keep the module underneath)."""
    for module in model.modules():
        if hasattr(module, method):
            return module
    raise ValueError(f"{type(model).__name__} has no {method}: not a Qwen vision-language model")


@contextlib.contextmanager
def images_at(model, image_mask: torch.Tensor | None) -> Iterator[None]:
    """Within the block, the model's forward puts the image features at the stream positions `image_mask`
    (Tensor[T] bool) marks (`SequenceImages.mask`, joined), not at every `<|image_pad|>` id. None: the model's own
    placement."""
    if image_mask is None:
        yield
        return
    owner = _owner(model, "get_placeholder_mask")

    def placeholder_mask(input_ids, inputs_embeds, image_features=None, video_features=None):
        image = image_mask.to(inputs_embeds.device).view(1, -1, 1).expand_as(inputs_embeds)
        if image_features is not None and image_features.shape[0] != int(image_mask.sum()):
            raise ValueError(f"{image_features.shape[0]} image features for {int(image_mask.sum())} image tokens")
        return image, torch.zeros_like(image)

    owner.get_placeholder_mask = placeholder_mask  # an instance attribute shadows the method for this block only
    try:
        yield
    finally:
        del owner.get_placeholder_mask
