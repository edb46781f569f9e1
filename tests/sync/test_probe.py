"""The log-prob probe's parts (slime.sync.probe, slime.rollout.probe): the comparison and its tolerance by precision,
the request's sampling params, and the batches that give every data-parallel rank every answer. The probe against a
real vLLM: tests/engine/vllm/test_vllm_server.py; in the push: tests/driver/test_weight_push.py; in runs:
tests/e2e/test_vllm_engine_e2e.py and the learning runs' metric records."""

from __future__ import annotations

import math

import pytest

from slime.rollout.probe import PROBE_TEXT, probe_batches, probe_params, probe_prompt
from slime.sync.probe import TOLERANCE, EngineProbe, check_probe, probe_precision, probe_tolerance
from slime.sync.verify import WeightMismatchError
from slime.types import Sample
from tests.helpers.compose import typed_config

A, B = "http://a:1", "http://b:2"


def test_the_tolerance_follows_the_coarser_precision_of_the_trainer_and_the_engines():
    assert probe_precision("auto", "auto", "cpu") == "fp32"
    assert probe_precision("auto", "auto", "cuda") == "bf16"
    assert probe_precision("fp32", "float32", "cuda") == "fp32"
    assert probe_precision("fp32", "bfloat16", "cpu") == "bf16"
    assert probe_precision("bf16", "float32", "cpu") == "bf16"
    assert TOLERANCE == {"fp32": 1e-3, "bf16": 0.1}


def test_the_runs_tolerance_is_its_key_or_its_precisions():
    assert probe_tolerance(typed_config([])) == 1e-3  # the embedded default: fp32 on CPU
    assert probe_tolerance(typed_config(["train.precision=bf16"])) == 0.1
    assert probe_tolerance(typed_config(["rollout.hf.dtype=bfloat16"])) == 0.1
    assert probe_tolerance(typed_config(["rollout.weight_sync.probe_tolerance=0.02"])) == 0.02
    # SGLang and vLLM are launched in the trainer's dtype (slime.driver.rollout_setup): fp32 on cuda is fp32
    cuda_vllm = ["rollout=vllm", "cluster.device=cuda"]
    assert probe_tolerance(typed_config([*cuda_vllm, "train.precision=fp32"])) == 1e-3
    assert probe_tolerance(typed_config(cuda_vllm)) == 0.1


def test_each_engine_beyond_the_tolerance_is_named_with_its_worst_token_and_nan_is_wrong():
    answers = [EngineProbe(A, [7, 8, 9], [-1.0, -2.0, -3.0]), EngineProbe(B, [5, 6], [-0.5, -0.25])]
    agree = check_probe(answers, [[-1.0, -2.0, -3.0001], [-0.5, -0.25]], tolerance=1e-3, version=3)
    assert agree["rollout/weight_probe_logprob_diff"] == pytest.approx(1e-4 / 3)
    assert agree["rollout/weight_probe_logprob_diff_max"] == pytest.approx(1e-4)
    with pytest.raises(WeightMismatchError) as info:
        check_probe(answers, [[-1.0, -2.0, -3.0], [-0.5, math.nan]], tolerance=1e-3, version=4)
    assert info.value.urls == (B,)
    assert f"version 4: the engines compute other log-probs than the trainer on the weights it pushed: engine {B}:" in (
        str(info.value)
    )
    with pytest.raises(WeightMismatchError) as info:
        check_probe(answers, [[-1.0, -4.0, -3.0], [-0.5, -0.25]], tolerance=0.1, version=5)
    assert str(info.value).endswith(
        f"engine {A}: mean |log-prob difference| 0.667 over 3 tokens (tolerance 0.1); token 1 (id 8): engine -2.0000, "
        "trainer -4.0000"
    )


def test_an_engine_that_answered_no_token_is_not_compared_and_a_count_mismatch_is_an_error():
    answers = [EngineProbe(A, [], []), EngineProbe(B, [5], [-0.5])]
    assert check_probe(answers, [[], [-0.5]], tolerance=1e-3, version=1)["rollout/weight_probe_logprob_diff"] == 0.0
    assert check_probe(answers[:1], [[]], tolerance=1e-3, version=1) == {}
    with pytest.raises(RuntimeError, match="the trainer scored 2 tokens of 1"):
        check_probe(answers[1:], [[-0.5, -0.1]], tolerance=1e-3, version=1)


def test_the_probe_samples_at_the_rollouts_temperature_without_cuts():
    rollout = {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "max_new_tokens": 512,
        "stop": ["\n"],
        "no_stop_trim": True,
    }
    assert probe_params(rollout, 16) == {
        "temperature": 0.7, "top_p": 1.0, "top_k": -1, "max_new_tokens": 16, "no_stop_trim": True,
    }  # fmt: skip


def test_every_data_parallel_rank_scores_every_answer_in_order():
    samples = []
    for index, length in enumerate((3, 2)):
        sample = Sample(index=index, tokens=[1, 2], prompt="")
        sample.append_response(list(range(10, 10 + length)), [-0.1] * length, "x")
        samples.append(sample)
    for dp in (1, 2, 3):
        batches = probe_batches(samples, dp)
        assert len(batches) == dp
        for batch in batches:
            assert batch.tokens == [[1, 2, 10, 11, 12], [1, 2, 10, 11]] and batch.response_lengths == [3, 2]
            assert batch.loss_masks == [[1, 1, 1], [1, 1]]


def test_the_probe_prompt_is_the_runs_tokenizers_reading_of_the_text():
    class Tokenizer:
        def __call__(self, text, add_special_tokens):
            assert text == PROBE_TEXT and add_special_tokens is False
            return {"input_ids": [4, 5, 6]}

    assert probe_prompt(Tokenizer()) == [4, 5, 6]
