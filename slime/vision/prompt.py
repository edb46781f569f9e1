"""A prompt with images as a vision-language model reads it: each image's placeholder repeated once per image token.

The count of an image's tokens comes from its size alone (the image processor's `get_number_of_image_patches`, over
the merger's fold), so the rollout, the prompt-length filter and the plan count them without computing pixels.
"""

from __future__ import annotations

from slime.vision.images import image_size
from slime.vision.processor import ImageTokens, expand_image_pads, image_processor


class PromptImages:
    """The image side of a vision-language checkpoint's prompts (`ImageTokens.of_checkpoint` is not None)."""

    def __init__(self, checkpoint: str, tokens: ImageTokens):
        self.checkpoint = checkpoint
        self.tokens = tokens

    @classmethod
    def of_checkpoint(cls, checkpoint: str) -> PromptImages | None:
        tokens = ImageTokens.of_checkpoint(checkpoint)
        return None if tokens is None else cls(checkpoint, tokens)

    def tokens_per_image(self, refs: list[str]) -> list[int]:
        """How many prompt tokens each image of `refs` becomes."""
        processor = image_processor(self.checkpoint)
        counts = []
        for ref in refs:
            width, height = image_size(ref)
            counts.append(processor.get_number_of_image_patches(height, width) // self.tokens.merge**2)
        return counts

    def prompt_ids(self, tokenizer, text: str, refs: list[str]) -> list[int]:
        """The token ids of the rendered prompt `text` (one placeholder per image of `refs`), expanded."""
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return expand_image_pads(ids, self.tokens_per_image(refs), self.tokens.image_pad)
