"""A vision-language model's packed micro-batch: each sample's pixels and multimodal RoPE positions.

`VisionInputs` holds, per sample of the loaded batch, its `SequenceImages` (`slime.vision.sequence`: pixels,
positions [3, L], the prompt's image tokens), made once per batch (the log-prob passes and the training pass pack
the same samples). `apply` turns a text `Packed` into the model's inputs: positions [3, 1, T], each sample's
restarting at 0, and the micro-batch's images concatenated in sample order; the attention still runs per sample
over `cu_seqlens`, so the result equals each sample's own forward.
"""

from __future__ import annotations

import itertools

import torch

from slime.train.packing import Packed
from slime.types import TrainBatch
from slime.vision.processor import PixelInputs
from slime.vision.sequence import ModelImages, SequenceImages


class VisionInputs:
    """The image side of one TrainBatch on the model `images` describes."""

    def __init__(self, images: ModelImages, batch: TrainBatch):
        self.images = images
        self.batch = batch
        self._made: dict[int, SequenceImages] = {}

    def _sample(self, index: int) -> SequenceImages:
        if index not in self._made:
            tokens = self.batch.tokens[index]
            refs = self.batch.images[index] if self.batch.images is not None else None
            prompt = len(tokens) - self.batch.response_lengths[index]
            made = self.images.sequence(tokens, refs, prompt_length=prompt) if refs else None
            self._made[index] = made or SequenceImages.text(len(tokens))
        return self._made[index]

    def apply(self, packed: Packed, indices: list[int]) -> Packed:
        """`packed` (the samples `indices`, in order, then any padding sequence) with 3D positions and the images."""
        made = [self._sample(i) for i in indices]
        bounds = packed.cu_seqlens.tolist()
        made += [SequenceImages.text(end - start) for start, end in itertools.pairwise(bounds[len(indices) :])]
        device = packed.input_ids.device
        packed.position_ids = torch.cat([m.positions for m in made], dim=-1).unsqueeze(1).to(device)  # [3, 1, T]
        images = [m.pixels for m in made if m.pixels is not None]
        if images:
            packed.image_mask = torch.cat([m.mask for m in made]).to(device)
            joined = PixelInputs.cat(images)
            packed.extra = {
                "pixel_values": joined.pixel_values.to(device),
                "image_grid_thw": joined.image_grid_thw.to(device),
            }
        return packed
