"""A long tail of response lengths on any task, for benchmarking the training loops (recipe=digit_long_tail).

One sample in `every`, chosen by its global sample index (`index % every == 0`), asks the engine for `factor` times
the response budget (`sampling_params["max_new_tokens"]`, i.e. rollout.max_response_len) and decodes all of it:
`ignore_eos` keeps generating past the end-of-turn token. Every other sample, and every eval sample, is the default
generate function's. Per sample rather than per group because a real tail is per response (one prompt's answers
differ in length), so a long sample holds its group as it would there.

`ignore_eos` rather than `min_new_tokens`: both give exactly `factor` x the budget, but min_new_tokens masks the stop
tokens' logits before the engine's log-probs are taken (slime/engine/hf/sampling.py, as SGLang), so the tail's
engine log-probs would no longer be the trainer's; ignore_eos changes when the engine stops, not what it samples
or reports. Rewards read the response text, from which the skipped special tokens are gone: `first_word` still
reads the answer, the first token.
"""

from __future__ import annotations

from typing import Any

from slime.rollout.base import RolloutContext
from slime.rollout.generate import generate as default_generate
from slime.types import Sample


def is_long(sample: Sample, every: int) -> bool:
    """Whether `sample` is one of the tail: its global index (over the run, from the data source) is a multiple of
    `every`."""
    return sample.index is not None and sample.index % every == 0


def long_params(sampling_params: dict[str, Any], factor: int) -> dict[str, Any]:
    """`sampling_params` for a tail sample: `factor` x the budget (tokens), every token of it decoded."""
    return {**sampling_params, "max_new_tokens": factor * sampling_params["max_new_tokens"], "ignore_eos": True}


async def generate(
    args: RolloutContext,
    sample: Sample,
    sampling_params: dict[str, Any],
    evaluation: bool = False,
    *,
    every: int = 16,
    factor: int = 10,
) -> Sample:
    """`rollout.generate_function`: one sample in `every` gets `factor` x the response budget, the rest the default
    generate function as is."""
    if evaluation or not is_long(sample, every):
        return await default_generate(args, sample, sampling_params)
    return await default_generate(args, sample, long_params(sampling_params, factor))
