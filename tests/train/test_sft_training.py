"""SFT through the real backend: only unmasked assistant tokens are trained; step_loss_mask 0 turns are context."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from slime.assets.tokenizer import build_tokenizer
from slime.rollout.postprocess import split_for_data_parallel
from slime.rollout.sft import sft_sample
from slime.types import Sample
from tests.helpers.fsdp_rank import make_backend, make_setup, train_rollout


def conversation(first_turn_mask: int) -> list[dict]:
    return [
        {"role": "user", "content": "what comes after 1 ?"},
        {"role": "assistant", "content": "2", "step_loss_mask": first_turn_mask},
        {"role": "user", "content": "what comes after 3 ?"},
        {"role": "assistant", "content": "4"},
    ]


def first_step_loss(model_dir, sample: Sample) -> float:
    setup = make_setup(
        model_dir,
        [
            "algo=sft",
            "rollout.batch_size=1",
            "rollout.n_samples_per_prompt=1",
            "train.global_batch_size=1",
            "train.num_steps_per_rollout=1",
        ],
    )
    batch = split_for_data_parallel([sample], [0.0], [0.0], step_sizes=[1], dp_size=1)[0]
    return train_rollout(make_backend(setup), batch)["steps"][0]["train/pg_loss"]


def reference_nll(model_dir, tokens: list[int], trained_positions: list[int]) -> float:
    """−mean log p(token) over `trained_positions`, from a plain HF forward (teacher forcing)."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0]
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    return float(-sum(log_probs[p - 1, tokens[p]] for p in trained_positions) / len(trained_positions))


def test_only_unmasked_assistant_tokens_are_trained(tiny_model_dir):
    tokenizer = build_tokenizer()
    masked = sft_sample(tokenizer, Sample(index=0, messages=conversation(first_turn_mask=0)))
    both = sft_sample(tokenizer, Sample(index=0, messages=conversation(first_turn_mask=1)))
    assert masked.tokens == both.tokens  # same text; only the masks differ
    n = len(masked.tokens)
    names = tokenizer.convert_ids_to_tokens(masked.tokens)
    # trained with the first turn masked: the last answer "4 <|im_end|>" only
    assert masked.loss_mask[-2:] == [1, 1] and sum(masked.loss_mask) == 2 and names[-2:] == ["4", "<|im_end|>"]
    loss_masked = first_step_loss(tiny_model_dir, masked)
    assert abs(loss_masked - reference_nll(tiny_model_dir, masked.tokens, [n - 2, n - 1])) < 1e-5
    # with the mask on, "2 <|im_end|>" of the first answer is trained too, and the loss changes
    first_answer = [i for i in range(n - both.response_length, n) if both.loss_mask[i - (n - both.response_length)]]
    assert len(first_answer) == 4 and [names[i] for i in first_answer[:2]] == ["2", "<|im_end|>"]
    loss_both = first_step_loss(tiny_model_dir, both)
    # per-sample reduction: the mean over the sample's 4 trained tokens
    assert abs(loss_both - reference_nll(tiny_model_dir, both.tokens, first_answer)) < 1e-5
    assert abs(loss_both - loss_masked) > 1e-3
