"""Unit tests for slime.engine.hf.generator / sampling against plain forward passes of the HF model."""

from __future__ import annotations

import pytest
import torch

from slime.engine.hf.generator import GenerationError, GenerationRequest, Generator
from slime.engine.hf.sampling import SamplingParams, SamplingParamsError

PROMPTS = [[1, 5, 11], [1, 5, 11, 16, 28, 23, 29, 62, 2, 1, 7], [4, 9], [1, 30, 31, 32, 33, 34]]


def _gen(tiny_model, seed=0) -> Generator:
    model, tok = tiny_model
    return Generator(model, tok, seed=seed)


def _req(prompt, **params) -> GenerationRequest:
    return GenerationRequest(list(prompt), SamplingParams.from_dict(params))


@torch.inference_mode()
def _full_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), V] of one unpadded sequence, without any cache."""
    return model(input_ids=torch.tensor([ids])).logits[0].float()


@torch.inference_mode()
def test_greedy_matches_manual_argmax_loop(tiny_model):
    model, _ = tiny_model
    results = _gen(tiny_model).generate([_req(p, temperature=0, max_new_tokens=10, ignore_eos=True) for p in PROMPTS])
    for prompt, res in zip(PROMPTS, results):
        ids = list(prompt)
        for _ in range(10):
            ids.append(int(_full_logits(model, ids)[-1].argmax()))
        assert res.output_ids == ids[len(prompt) :]
        assert res.finish_reason == {"type": "length", "length": 10}
        # log-probs with T = 1 for greedy, against the uncached, unpadded forward
        ref = torch.log_softmax(_full_logits(model, ids), -1)[len(prompt) - 1 : -1]
        expected = ref.gather(1, torch.tensor(res.output_ids).unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(torch.tensor(res.output_logprobs), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("params", [{"temperature": 0.7}, {"temperature": 1.3, "top_p": 0.5, "top_k": 5}])
def test_sampled_logprobs_are_untruncated_log_softmax(tiny_model, params):
    model, _ = tiny_model
    temperature = params["temperature"]
    results = _gen(tiny_model, seed=3).generate(
        [_req(p, max_new_tokens=12, ignore_eos=True, **params) for p in PROMPTS]
    )
    for prompt, res in zip(PROMPTS, results):
        assert len(res.output_ids) == len(res.output_logprobs) == 12
        ref = torch.log_softmax(_full_logits(model, prompt + res.output_ids) / temperature, -1)[len(prompt) - 1 : -1]
        expected = ref.gather(1, torch.tensor(res.output_ids).unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(torch.tensor(res.output_logprobs), expected, atol=1e-5, rtol=0)
        if "top_k" in params:  # truncation: every sampled token is among the 5 most likely
            top5 = ref.topk(5, dim=-1).indices
            assert all(t in top5[j].tolist() for j, t in enumerate(res.output_ids))


def test_max_new_tokens_and_zero_budget(tiny_model):
    res = _gen(tiny_model).generate(
        [_req(PROMPTS[0], max_new_tokens=7, ignore_eos=True), _req(PROMPTS[1], max_new_tokens=0)]
    )
    assert len(res[0].output_ids) == 7 and res[0].finish_reason == {"type": "length", "length": 7}
    assert res[1].output_ids == [] and res[1].finish_reason == {"type": "length", "length": 0} and res[1].text == ""


def test_stop_token_is_kept_in_ids_and_trimmed_from_text(tiny_model):
    gen = _gen(tiny_model)
    base = gen.generate([_req(PROMPTS[1], temperature=1.0, sampling_seed=11, max_new_tokens=8, ignore_eos=True)])[0]
    stop_id = base.output_ids[3]
    first = base.output_ids.index(stop_id)
    for no_stop_trim in (False, True):
        res = gen.generate(
            [
                _req(
                    PROMPTS[1],
                    temperature=1.0,
                    sampling_seed=11,
                    max_new_tokens=8,
                    stop_token_ids=[stop_id],
                    no_stop_trim=no_stop_trim,
                )
            ]
        )[0]
        assert res.finish_reason == {"type": "stop", "matched": stop_id}
        assert res.output_ids == base.output_ids[: first + 1]
        assert res.output_logprobs == pytest.approx(base.output_logprobs[: first + 1], abs=1e-6)
        kept = res.output_ids if no_stop_trim else res.output_ids[:-1]
        assert res.text == gen.decode(kept)


def test_stop_string_and_min_new_tokens(tiny_model):
    gen = _gen(tiny_model)
    base = gen.generate([_req(PROMPTS[3], temperature=0, max_new_tokens=8, ignore_eos=True)])[0]
    word = gen.decode([base.output_ids[2]])
    res = gen.generate([_req(PROMPTS[3], temperature=0, max_new_tokens=8, stop=word)])[0]
    assert res.finish_reason == {"type": "stop", "matched": word}
    assert word not in res.text and base.text.startswith(res.text)
    # min_new_tokens: the stop token is masked (never sampled) until 3 tokens exist
    first_tok = base.output_ids[0]
    res = gen.generate(
        [_req(PROMPTS[3], temperature=0, max_new_tokens=8, stop_token_ids=[first_tok], min_new_tokens=3)]
    )[0]
    assert first_tok not in res.output_ids[:3]
    assert len(res.output_ids) >= 3


def test_seeds_reproduce_and_differ(tiny_model):
    reqs = lambda: [_req(p, temperature=1.0, max_new_tokens=16, ignore_eos=True) for p in PROMPTS]  # noqa: E731
    a = [r.output_ids for r in _gen(tiny_model, seed=5).generate(reqs())]
    b = [r.output_ids for r in _gen(tiny_model, seed=5).generate(reqs())]
    c = [r.output_ids for r in _gen(tiny_model, seed=6).generate(reqs())]
    assert a == b
    assert a != c  # 64 tokens from a ~uniform 80-way distribution: a collision is ~impossible
    # per-request sampling_seed: reproducible whatever the batch composition and server seed
    solo = _gen(tiny_model, seed=1).generate([_req(PROMPTS[0], temperature=1.0, max_new_tokens=16, sampling_seed=7)])
    mixed = _gen(tiny_model, seed=2).generate(
        reqs()[1:] + [_req(PROMPTS[0], temperature=1.0, max_new_tokens=16, sampling_seed=7)]
    )
    assert solo[0].output_ids == mixed[-1].output_ids


def test_penalties_and_abort(tiny_model):
    gen = _gen(tiny_model)
    res = gen.generate([_req(PROMPTS[0], temperature=0, max_new_tokens=20, presence_penalty=2.0, ignore_eos=True)])[0]
    assert len(set(res.output_ids)) == 20  # a huge presence penalty forbids repeats under greedy
    req = _req(PROMPTS[0], max_new_tokens=5)
    req.aborted = True
    res = gen.generate([req, _req(PROMPTS[1], max_new_tokens=3, ignore_eos=True)])
    assert res[0].finish_reason["type"] == "abort" and res[0].output_ids == []
    assert len(res[1].output_ids) == 3


def test_invalid_params_and_prompts(tiny_model):
    with pytest.raises(SamplingParamsError, match="not_a_param"):
        SamplingParams.from_dict({"max_new_tokens": 3, "not_a_param": 1})
    with pytest.raises(SamplingParamsError, match="regex"):
        SamplingParams.from_dict({"regex": "a+"})
    with pytest.raises(SamplingParamsError, match="top_p"):
        SamplingParams.from_dict({"top_p": 0})
    assert SamplingParams.from_dict({"n": 1, "regex": None, "stop": "x"}).stop == ["x"]
    gen = _gen(tiny_model)
    with pytest.raises(GenerationError):
        gen.generate([_req([])])
    with pytest.raises(GenerationError, match="context length"):
        gen.generate([_req([1] * 600)])
    assert gen.max_new_tokens(_req([1] * 500, max_new_tokens=100)) == 12  # capped by the 512-token context


def test_prefix_cache_reuses_a_lone_prefill_bit_for_bit(tiny_model):
    """A prompt decoded alone again reuses its stored prefill and first-token decode step: the same
    computation, so the same bits as a generator without the cache; batches never read or fill it; the
    least recently used entry goes first."""
    model, tok = tiny_model

    def reqs():
        return [
            _req(p, temperature=t, max_new_tokens=6, sampling_seed=s)
            for p in PROMPTS
            for t, s in ((1.0, 1), (1.0, 2), (1.0, 3), (0, None), (0, None))
        ]

    plain = Generator(model, tok, prefix_cache_tokens=0)
    cached = _gen(tiny_model)
    expected = [plain.generate([r])[0] for r in reqs()]
    got = [cached.generate([r])[0] for r in reqs()]
    assert [(r.output_ids, r.output_logprobs, r.text) for r in got] == [
        (r.output_ids, r.output_logprobs, r.text) for r in expected
    ]
    assert [r.cached_tokens for r in got] == [n for p in PROMPTS for n in (0,) + (len(p) - 1,) * 4]
    assert all(r.cached_tokens == 0 for r in expected)
    # per prompt: 4 prefill hits, and at least the second greedy request's first-token step
    assert cached.prefix_cache.hits >= 5 * len(PROMPTS)
    batch = cached.generate([_req(PROMPTS[0], max_new_tokens=2), _req(PROMPTS[2], max_new_tokens=2)])
    assert [r.cached_tokens for r in batch] == [0, 0]
    cached.flush_cache()
    assert cached.generate([_req(PROMPTS[0], max_new_tokens=2)])[0].cached_tokens == 0

    small = Generator(model, tok, prefix_cache_tokens=6)  # prompt tokens
    hits = lambda prompt: small.generate([_req(prompt, max_new_tokens=1)])[0].cached_tokens > 0  # noqa: E731
    assert [hits(PROMPTS[0]), hits(PROMPTS[2]), hits(PROMPTS[0]), hits(PROMPTS[1])] == [False, False, True, False]
    assert hits(PROMPTS[1]) is False  # 11 tokens: never stored
    assert [hits([4, 9, 1]), hits(PROMPTS[0]), hits(PROMPTS[2])] == [False, True, False]  # [4, 9] was evicted
