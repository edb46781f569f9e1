"""rollout.agent.samples=turns on one fsdp rank: two 2-turn episodes trained whole and as their four turns. Each turn
sees the episode's ids before it and trains its sampled ids with the episode's advantage, so under the per-token
reduction the step is the same (loss, gradient norm); under the per-sample one each turn counts as a trajectory."""

from __future__ import annotations

import pytest

from slime.rollout.agent.turn_samples import expand_steps
from slime.rollout.postprocess import split_for_data_parallel
from slime.types import Sample
from tests.helpers.fsdp_rank import make_backend, make_setup, train_rollout

SIZES = [
    "rollout.batch_size=1",
    "rollout.n_samples_per_prompt=2",
    "train.global_batch_size=2",
    "train.num_steps_per_rollout=1",
]


def episode(index: int, offset: int, reward: float) -> Sample:
    """First prompt (4 ids), turn 0 samples 3 ids, the gateway adds 2 (a tool's answer), turn 1 samples 2."""
    prompt, first, added, second = [10 + offset, 11, 12, 13], [20 + offset, 21, 22], [30, 31], [40 + offset, 41]
    response = first + added + second
    turns = [
        {"prompt_length": 4, "sampled": first, "weight_version": "0", "finish_reason": "stop", "mismatch": False},
        {"prompt_length": 9, "sampled": second, "weight_version": "0", "finish_reason": "stop", "mismatch": False},
    ]
    return Sample(
        index=index,
        group_index=0,
        tokens=prompt + response,
        response_length=len(response),
        loss_mask=[1, 1, 1, 0, 0, 1, 1],
        rollout_log_probs=[-1.0, -2.0, -0.5, 0.0, 0.0, -1.5, -0.25],
        reward=reward,
        metadata={"agent": {"turns": turns, "mismatched_turns": 0, "first_prompt_length": 4}},
    )


def step(tiny_model_dir, overrides: list[str], turns: bool) -> dict:
    setup = make_setup(tiny_model_dir, [*SIZES, *overrides])
    samples, raw, rewards, steps = [episode(0, 0, 1.0), episode(1, 5, 0.0)], [1.0, 0.0], [0.7, -0.7], [2]
    if turns:
        samples, raw, rewards, steps = expand_steps(samples, raw, rewards, global_batch_size=2, num_steps=1)
    (batch,) = split_for_data_parallel(samples, raw, rewards, step_sizes=steps, dp_size=1)
    return train_rollout(make_backend(setup), batch)["steps"][0]


def test_turns_train_as_their_episode_under_the_per_token_reduction(tiny_model_dir):
    per_token = ["algo.calculate_per_token_loss=true"]
    whole, turns = step(tiny_model_dir, per_token, turns=False), step(tiny_model_dir, per_token, turns=True)
    assert whole["train/global_batch_size"] == 2.0 and turns["train/global_batch_size"] == 4.0
    assert whole["train/pg_loss"] != 0.0
    for key in ("train/pg_loss", "train/grad_norm", "train/entropy_loss"):
        assert turns[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key


def test_under_the_per_sample_reduction_each_turn_is_a_trajectory(tiny_model_dir):
    whole, turns = step(tiny_model_dir, [], turns=False), step(tiny_model_dir, [], turns=True)
    assert turns["train/global_batch_size"] == 4.0
    assert turns["train/pg_loss"] != pytest.approx(whole["train/pg_loss"], rel=1e-3)
