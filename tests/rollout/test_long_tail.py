"""The long-tail generate function (recipe=digit_long_tail, slime.rollout.long_tail): which samples are long, and
that a real hf engine gives them 10x the embedded default's 2 tokens while the others stay within 2."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from slime.assets.digit_task import make_prompt
from slime.config.hooks import load_callable
from slime.config.schema import RolloutConfig
from slime.rollout.base import RolloutContext
from slime.rollout.entry_points import GENERATE_SHAPE
from slime.rollout.long_tail import is_long
from slime.rollout.rewards import first_word
from slime.types import Sample
from tests.helpers.compose import typed_config
from tests.helpers.engines import start_engine

GROUP = 8  # the embedded default's rollout.n_samples_per_prompt
# What the rollout sends for the embedded default (slime.rollout.producer.sampling_params)
EMBEDDED_PARAMS = {"temperature": 1.0, "max_new_tokens": 2, "no_stop_trim": True, "skip_special_tokens": True}


def test_one_sample_in_16_is_long_the_first_of_every_other_group():
    step = [Sample(index=i, group_index=i // GROUP) for i in range(256)]  # one embedded rollout step
    long = [s for s in step if is_long(s, every=16)]
    assert [s.index for s in long] == list(range(0, 256, 16))
    assert [s.group_index for s in long] == list(range(0, 32, 2))
    assert not is_long(Sample(index=None), every=16)  # a sample the data source did not number


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    """One hf engine on the embedded model, batching as rollout.deterministic=false lets it."""
    server = start_engine(tiny_model_dir, tmp_path_factory.mktemp("long_tail_logs"), max_batch_size=64)
    yield server
    server.shutdown()


def recipe_generate():
    """The generate function recipe=digit_long_tail configures, loaded as a run loads it."""
    spec = typed_config(["recipe=digit_long_tail"]).rollout.generate_function
    return load_callable(spec, key="rollout.generate_function", **GENERATE_SHAPE)


def generate_step(engine, tokenizer, generate, *, num_samples: int, evaluation: bool = False) -> list[Sample]:
    """`num_samples` digit-task samples (indices 0..num_samples-1) generated at once, seeded per request."""
    args = RolloutContext(
        config=RolloutConfig(batch_size=1),
        router_url=engine.url,
        tokenizer=tokenizer,
        batch_size=1,
        over_sampling_batch_size=1,
        sampling_params=EMBEDDED_PARAMS,
        max_in_flight=num_samples,
        rewards=None,
        sampling_seed=0,
    )
    messages = [make_prompt(i // GROUP % 10)["prompt"] for i in range(num_samples)]
    samples = [
        Sample(index=i, group_index=i // GROUP, prompt=tokenizer.apply_chat_template(m, tokenize=False))
        for i, m in enumerate(messages)
    ]

    async def run() -> list[Sample]:
        async with aiohttp.ClientSession() as session:
            args.session = session
            return await asyncio.gather(*(generate(args, s, EMBEDDED_PARAMS, evaluation=evaluation) for s in samples))

    return asyncio.run(run())


def test_long_samples_decode_10x_the_budget_and_the_reward_reads_their_first_token(engine, tiny_model_dir):
    from transformers import AutoTokenizer  # heavy: only the engine tests need it

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    samples = generate_step(engine, tokenizer, recipe_generate(), num_samples=48)
    lengths = {s.index: s.response_length for s in samples}
    assert {i: n for i, n in lengths.items() if i % 16 == 0} == {0: 20, 16: 20, 32: 20}
    assert all(1 <= n <= 2 for i, n in lengths.items() if i % 16), lengths
    for s in samples:
        s.check_alignment()
        # the reward reads the first token that has text (special tokens and ids past the vocabulary have none, as
        # in a short sample), not the tail after it
        words = [tokenizer.decode([t], skip_special_tokens=True) for t in s.tokens[s.prompt_length :]]
        answer = next((w for w in words if w), "")
        assert first_word(s.response, label=answer) == 1.0, (s.index, words)
    # eval samples are the default generate's, whatever their index
    evals = generate_step(engine, tokenizer, recipe_generate(), num_samples=17, evaluation=True)
    assert max(s.response_length for s in evals) <= 2
