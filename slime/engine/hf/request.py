"""What the hf engine's generator takes and gives: one request to generate, its result, and the error for a request
that cannot be served (HTTP 400)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from slime.engine.hf.sampling import SamplingParams


class GenerationError(ValueError):
    """A request that cannot be served as given (the server answers HTTP 400)."""


@dataclass
class GenerationRequest:
    """One sequence to generate. `aborted` may be set from another thread; it is checked every step."""

    input_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    rid: str = ""
    aborted: bool = False
    lora: Optional[str] = None  # the LoRA adapter it runs with (SGLang's `lora_path`: the adapter's name)


@dataclass
class GenerationResult:
    output_ids: list[int]
    output_logprobs: list[float]  # natural log, one per output id
    text: str
    finish_reason: dict[str, Any]
    cached_tokens: int = 0  # prompt tokens served by the prefix cache, counted as SGLang does (`Generator.generate`)
    # with `capture_routes`: int32 [prompt + output - 1, MoE layers, top-k], each fed token's experts
    routes: Optional[torch.Tensor] = None
