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
    images: Optional[list[str]] = None  # SGLang's `image_data`: the references of the prompt's images, in order
    vision: Any = None  # its images as the model takes them (`SequenceImages`), made by `Generator.validate`


@dataclass
class GenerationResult:
    output_ids: list[int]
    output_logprobs: list[float]  # natural log, one per output id
    text: str
    finish_reason: dict[str, Any]
    cached_tokens: int = 0  # prompt tokens served by the prefix cache, counted as SGLang does (`Generator.generate`)
    # with `capture_routes`: int32 [prompt + output - 1, MoE layers, top-k], each fed token's experts
    routes: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class VersionChange:
    """The weight version changed while a request ran: its first `num_output_tokens` were sampled by `old_version`."""

    old_version: str
    num_output_tokens: int


def version_spans(changes: list[VersionChange], current: str, num_tokens: int) -> list[dict[str, Any]]:
    """`meta_info.weight_versions` of a request that ends with `num_tokens` output tokens under `current`: runs of
    output tokens [start, end) and the version that sampled them, as SGLang 0.5.23 builds them
    (`sglang/srt/utils/weight_versions.py: compute_weight_version_spans`, then the tokenizer manager's
    `add_weight_versions_to_meta_info`); one span for a request no weight update ran across."""
    spans: list[dict[str, Any]] = []
    for version, end in [*((c.old_version, c.num_output_tokens) for c in changes), (current, num_tokens)]:
        end = min(end, num_tokens)
        if spans and end <= spans[-1]["end"]:
            continue
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = end
            continue
        spans.append({"version": version, "start": spans[-1]["end"] if spans else 0, "end": end})
    return [span for span in spans if span["start"] < num_tokens or span["start"] == 0]
