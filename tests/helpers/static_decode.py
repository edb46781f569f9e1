"""Helpers of the static-cache decode tests (tests/engine/hf/test_static_decode.py, tests/gpu/test_engine_cuda.py):
one continuous batch run to the end on a schedule of joins, and the comparison of two runs' results."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from slime.engine.hf.generator import GenerationRequest, Generator
from slime.engine.hf.sampling import SamplingParams


def request(prompt: Sequence[int], **params) -> GenerationRequest:
    """A request for `prompt` with these sampling params (greedy unless `temperature` says otherwise)."""
    return GenerationRequest(list(prompt), SamplingParams.from_dict({"temperature": 0, **params}))


def run_schedule(gen: Generator, joins: dict[int, list[GenerationRequest]]) -> dict:
    """Results by key (the request's index in the schedule's order) of one batch of `gen`: `joins[k]`'s requests
    added after k steps (0: before the first), stepped until every row has finished."""
    batch, results, key, steps = gen.new_batch(), {}, 0, 0
    while True:
        if steps in joins:
            results.update(batch.add(joins[steps], range(key, key + len(joins[steps]))))
            key += len(joins[steps])
        if not batch and steps >= max(joins):
            return results
        if batch:
            results.update(batch.step())
        steps += 1


def assert_same_results(got: dict, expected: dict, atol: float) -> None:
    """The same keys, tokens and finish reasons, and log-probs within `atol`."""
    assert got.keys() == expected.keys()
    for key, want in expected.items():
        assert got[key].output_ids == want.output_ids, key
        assert got[key].finish_reason == want.finish_reason, key
        assert got[key].cached_tokens == want.cached_tokens, key
        torch.testing.assert_close(
            torch.tensor(got[key].output_logprobs), torch.tensor(want.output_logprobs), atol=atol, rtol=0
        )
