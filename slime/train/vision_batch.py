"""A vision-language model's packed micro-batch: each sample's pixels and multimodal RoPE positions.

`VisionInputs` holds, per sample of the loaded batch, the image processor's pixels (`slime.vision.processor`) and
the sample's [3, L] positions (transformers' `get_rope_index`), made once per batch (the log-prob passes and the
training pass pack the same samples). `apply` turns a text `Packed` into the model's inputs: positions [3, 1, T],
each sample's restarting at 0, and the micro-batch's images concatenated in sample order; the attention still runs
per sample over `cu_seqlens`, so the result equals each sample's own forward.
"""

from __future__ import annotations

import itertools

import torch

from slime.train.packing import Packed
from slime.types import TrainBatch
from slime.vision.processor import (
    ImageTokens,
    PixelInputs,
    mrope_positions,
    pixel_inputs,
    prompt_image_mask,
    rope_index,
)


class VisionInputs:
    """The image side of one TrainBatch, on a vision-language checkpoint (`ImageTokens.of_checkpoint` not None)."""

    def __init__(self, checkpoint: str, model, batch: TrainBatch):
        self.checkpoint = checkpoint
        self.tokens = ImageTokens.of_checkpoint(checkpoint)
        self.get_rope_index = rope_index(model)
        self.batch = batch
        self._made: dict[int, tuple[PixelInputs | None, torch.Tensor, torch.Tensor]] = {}

    def _sample(self, index: int) -> tuple[PixelInputs | None, torch.Tensor, torch.Tensor]:
        """(pixels or None, positions Tensor[3, L] int64, image tokens Tensor[L] bool) of sample `index`."""
        if index not in self._made:
            tokens = self.batch.tokens[index]
            refs = self.batch.images[index] if self.batch.images is not None else None
            pixels = pixel_inputs(self.checkpoint, refs) if refs else None
            prompt = len(tokens) - self.batch.response_lengths[index]
            mask = prompt_image_mask(tokens, prompt if pixels is not None else 0, self.tokens.image_pad)
            positions, _ = mrope_positions(self.get_rope_index, tokens, pixels, mask)
            self._made[index] = (pixels, positions, mask)
        return self._made[index]

    def apply(self, packed: Packed, indices: list[int]) -> Packed:
        """`packed` (the samples `indices`, in order, then any padding sequence) with 3D positions and the images."""
        made = [self._sample(i) for i in indices]
        bounds = packed.cu_seqlens.tolist()
        positions, masks = [p for _, p, _ in made], [m for _, _, m in made]
        for start, end in itertools.pairwise(bounds[len(indices) :]):  # a padding sequence: text positions
            positions.append(torch.arange(end - start).expand(3, -1))
            masks.append(torch.zeros(end - start, dtype=torch.bool))
        device = packed.input_ids.device
        packed.position_ids = torch.cat(positions, dim=-1).unsqueeze(1).to(device)  # [3, 1, T]
        images = [pixels for pixels, _, _ in made if pixels is not None]
        if images:
            packed.image_mask = torch.cat(masks).to(device)
            joined = PixelInputs.cat(images)
            packed.extra = {
                "pixel_values": joined.pixel_values.to(device),
                "image_grid_thw": joined.image_grid_thw.to(device),
            }
        return packed
