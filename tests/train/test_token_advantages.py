"""Reward post-processing (rollout side) and advantages (train side) per estimator, by hand, float64."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from slime.config.schema import AlgoConfig
from slime.rollout.filters import check_reward_nonzero_std
from slime.rollout.postprocess import overlong_penalty, post_process_rewards
from slime.train.token_advantages import compute_advantages
from slime.types import Sample

F64 = dict(dtype=torch.float64)


def algo(estimator: str, **kw) -> AlgoConfig:
    return AlgoConfig(name=estimator, advantage_estimator=estimator, **kw)


def t(*values):
    return torch.tensor(values, **F64)


def test_post_processing_per_estimator():
    raw = t(1, 0, 0, 0, 1, 1, 0, 0)  # two groups of n = 4
    # grpo/gspo: (r − mean)/(std + 1e-6); group 1: mean 0.25, std 0.5; group 2: mean 0.5, std √(1/3)
    s2 = (1 / 3) ** 0.5
    expected = t(
        0.75 / 0.500001,
        -0.25 / 0.500001,
        -0.25 / 0.500001,
        -0.25 / 0.500001,
        0.5 / (s2 + 1e-6),
        0.5 / (s2 + 1e-6),
        -0.5 / (s2 + 1e-6),
        -0.5 / (s2 + 1e-6),
    )
    for est in ("grpo", "gspo"):
        torch.testing.assert_close(post_process_rewards(raw, algo(est), 4), expected, rtol=1e-12, atol=1e-12)
    # Dr.GRPO and reinforce++-baseline: mean only
    centred = t(0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5)
    torch.testing.assert_close(post_process_rewards(raw, algo("grpo", disable_grpo_std_normalization=True), 4), centred)
    torch.testing.assert_close(post_process_rewards(raw, algo("reinforce_plus_plus_baseline"), 4), centred)
    # rloo: r_i − mean of the other three = 4/3 · (r − mean)
    torch.testing.assert_close(post_process_rewards(raw, algo("rloo"), 4), centred * 4 / 3)
    for est in ("reinforce_plus_plus", "ppo", "sft"):
        torch.testing.assert_close(post_process_rewards(raw, algo(est), 4), raw)
    torch.testing.assert_close(post_process_rewards(raw, algo("grpo", disable_rewards_normalization=True), 4), raw)


def test_identical_rewards_and_single_sample_groups_give_no_signal_and_no_nan():
    same = t(1, 1, 1, 1)
    assert torch.equal(post_process_rewards(same, algo("grpo"), 4), torch.zeros(4, **F64))
    single = t(1, 0, 1)  # n = 1: the std division is forced off, the centred reward is 0
    assert torch.equal(post_process_rewards(single, algo("grpo"), 1), torch.zeros(3, **F64))
    with pytest.raises(ValueError, match="6"):
        post_process_rewards(t(1, 0, 0, 0, 1, 0), algo("grpo"), 4)  # 6 rewards are not groups of 4


def test_overlong_penalty_and_zero_std_filter():
    # max 10 tokens, buffer 4: free up to 6 tokens, then −(L − 6)/4, floored at −1
    assert overlong_penalty([3, 6, 7, 8, 10], max_response_len=10, buffer_len=4, factor=1.0) == [
        0.0,
        0.0,
        -0.25,
        -0.5,
        -1.0,
    ]
    keep = check_reward_nonzero_std(SimpleNamespace(reward_key=None), [Sample(reward=1.0), Sample(reward=0.0)])
    drop = check_reward_nonzero_std(SimpleNamespace(reward_key=None), [Sample(reward=1.0), Sample(reward=1.0)])
    assert keep.keep and not drop.keep and drop.reason == "zero_std_1.0"


def advantages(a: AlgoConfig, rewards, lengths, mask=None, old=None, ref=None, values=None):
    total = sum(lengths)
    mask = torch.ones(total, **F64) if mask is None else mask
    return compute_advantages(
        a,
        rewards=rewards,
        response_lengths=lengths,
        loss_mask=mask,
        old_log_probs=old,
        ref_log_probs=ref,
        values=values,
        all_reduce=None,
    )


def test_grpo_broadcasts_and_truncated_samples_are_not_special():
    # sample 1 is truncated (hit max length, 3 tokens, all masked); its reward still covers every token
    adv, returns, kl = advantages(algo("grpo"), t(0.5, -0.5), [2, 3])
    torch.testing.assert_close(adv, t(0.5, 0.5, -0.5, -0.5, -0.5))
    assert returns is None and torch.equal(kl, torch.zeros(5, **F64))


def test_reinforce_plus_plus_reference_example():
    # docs/algorithms.md#advantage-estimators: kl = [0.1, 0, 0.2] (k1 = old − ref), kl_coef 0.5, r = 1, γ = 1
    # ρ = [−0.05, 0, −0.1 + 1] -> G = [0.85, 0.9, 0.9]; no whitening here to see the raw returns
    old = t(-1.0, -1.0, -1.0)
    ref = old - t(0.1, 0.0, 0.2)
    adv, returns, kl = advantages(algo("reinforce_plus_plus", kl_coef=0.5), t(1.0), [3], old=old, ref=ref)
    torch.testing.assert_close(kl, t(0.1, 0.0, 0.2))
    torch.testing.assert_close(adv, t(0.85, 0.9, 0.9))
    torch.testing.assert_close(returns, adv)


def test_reinforce_plus_plus_fully_masked_sample_is_rejected():
    with pytest.raises(ValueError):
        advantages(algo("reinforce_plus_plus"), t(1.0, 0.0), [2, 2], mask=t(1, 1, 0, 0))


def test_reinforce_plus_plus_baseline_and_whitening():
    # A_t = r̃ − kl_coef·kl; r̃ = [0.75, −0.25] (already centred), kl = 0 -> [0.75, 0.75 | −0.25, −0.25]
    # whitened: μ = 0.25, σ² = (Σ m·A²/N − μ²)·N/(N−1) = (0.3125 − 0.0625)·4/3 = 1/3 -> ±0.8660254
    adv, _, _ = advantages(algo("reinforce_plus_plus_baseline", normalize_advantages=True), t(0.75, -0.25), [2, 2])
    torch.testing.assert_close(adv, t(0.8660254, 0.8660254, -0.8660254, -0.8660254), rtol=0, atol=1e-6)


def test_ppo_gae_reference_example():
    # docs/algorithms.md#advantage-estimators:
    # V = [0.2, 0.4, 0.6], r = 1, γ = 1, λ = 0.9 -> A = [0.704, 0.56, 0.4], R = A + V
    adv, returns, _ = advantages(algo("ppo", lambd=0.9), t(1.0), [3], values=t(0.2, 0.4, 0.6))
    torch.testing.assert_close(adv, t(0.704, 0.56, 0.4))
    torch.testing.assert_close(returns, t(0.904, 0.96, 1.0))


def test_sft_has_no_advantages():
    adv, returns, _ = advantages(algo("sft"), t(0.0), [2])
    assert torch.equal(adv, torch.zeros(2, **F64)) and returns is None
