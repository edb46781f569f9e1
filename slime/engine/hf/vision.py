"""A request's images on the hf engine: SGLang's `image_data` (the references) read into the model's inputs for the
prompt (`slime.vision.sequence`), a request that cannot be served refused as HTTP 400.

The rollout sends the prompt's ids with each image's placeholder already repeated once per image token (as the
model's processor expands it); a request whose ids hold another number of image tokens than its images make is
refused, as SGLang refuses a prompt whose placeholders do not match its images.
"""

from __future__ import annotations

from slime.engine.hf.request import GenerationError
from slime.vision.images import ImageError
from slime.vision.sequence import ImageTokenCountError, ModelImages, SequenceImages


class EngineVision(ModelImages):
    """The image side of a vision-language checkpoint the engine serves."""

    def prompt(self, input_ids: list[int], refs: list[str]) -> SequenceImages:
        """The request's images (its ids are all prompt); GenerationError when one cannot be read or the ids hold
        another number of image tokens."""
        try:
            return self.sequence(input_ids, refs, prompt_length=len(input_ids))
        except ImageError as exc:
            raise GenerationError(f"image_data: {exc}") from None
        except ImageTokenCountError as exc:
            raise GenerationError(
                f"input_ids hold {exc.found} image tokens (id {self.tokens.image_pad}); the {exc.images} images of "
                f"image_data make {exc.wanted}: expand each placeholder by its image's token count"
            ) from None
