"""The functions the estimator records of `slime.algo.estimators` name: reward transforms (rollout side), token
advantages and policy-gradient losses (train side), and the inputs they take.

    reward transform:  fn(raw Tensor[N], n_samples_per_prompt, algo) -> Tensor[N]; groups are n consecutive samples
    token advantages:  fn(AdvantageInputs, algo) -> (advantages Tensor[T], returns Tensor[T] or None), before whitening
    policy loss:       fn(PolicyLossInputs, algo) -> {"loss": un-reduced per-token loss with gradient, and optionally
                       detached per-token metrics "clipfrac", "ppo_kl", "ratio"}

`algo` is the algorithm's knobs duck-typed (`AlgoKnobs`: `slime.config.schema.AlgoConfig` in practice). Layout as
in `slime.algo`: per-sample tensors are Tensor[B], per-token tensors flat Tensor[T], T = sum(response_lengths);
log-probs in nats.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch
from torch import Tensor

from slime.algo.advantages import (
    broadcast_to_tokens,
    gae,
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_returns,
)
from slime.algo.policy_loss import cispo_loss, gspo_log_ratio, ppo_clip_loss, sft_loss
from slime.algo.rewards import group_normalize, rloo_advantages


class AlgoKnobs(Protocol):
    """The `algo.*` values the estimator functions read (an `AlgoConfig`, duck-typed)."""

    disable_grpo_std_normalization: bool
    kl_coef: float
    gamma: float
    lambd: float
    eps_clip: float
    eps_clip_high: float | None
    eps_clip_c: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdvantageInputs:
    """One rank's tokens for `Estimator.token_advantages`.

    rewards: Tensor[B], already transformed by the rollout side (`Estimator.reward_transform`).
    kl: Tensor[T], the reward-shaping KL between the old and reference policies (zeros when kl_coef = 0).
    loss_mask: Tensor[T] of 0/1. values: Tensor[T] critic values, or None without a critic.
    """

    rewards: Tensor
    kl: Tensor
    loss_mask: Tensor
    response_lengths: list[int]
    values: Tensor | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyLossInputs:
    """One micro-batch's tokens for `Estimator.policy_loss`: log_probs (with gradient), old_log_probs,
    advantages and loss_mask, each Tensor[T]; response_lengths hold each sample's full response."""

    log_probs: Tensor
    old_log_probs: Tensor
    advantages: Tensor
    loss_mask: Tensor
    response_lengths: list[int]


# --- reward transforms (rollout side; docs/algorithms.md#reward-post-processing) ---


def raw_rewards(raw: Tensor, n_samples_per_prompt: int, algo: AlgoKnobs) -> Tensor:
    """The raw rewards: the trainer shapes them itself (reinforce++, ppo) or reads none (sft)."""
    return raw


def group_normalized_rewards(raw: Tensor, n_samples_per_prompt: int, algo: AlgoKnobs) -> Tensor:
    """GRPO: group mean-centred, divided by the group std unless disable_grpo_std_normalization or n = 1."""
    divide_std = not algo.disable_grpo_std_normalization and n_samples_per_prompt > 1
    return group_normalize(raw, n_samples_per_prompt, subtract_mean=True, divide_std=divide_std)


def group_centred_rewards(raw: Tensor, n_samples_per_prompt: int, algo: AlgoKnobs) -> Tensor:
    """Group mean-centred only (reinforce++-baseline)."""
    return group_normalize(raw, n_samples_per_prompt, subtract_mean=True, divide_std=False)


def leave_one_out_rewards(raw: Tensor, n_samples_per_prompt: int, algo: AlgoKnobs) -> Tensor:
    """RLOO: r_i minus the mean of the other samples of its group."""
    return rloo_advantages(raw, n_samples_per_prompt)


# --- token advantages (train side; docs/algorithms.md#advantage-estimators) ---


def broadcast_advantages(x: AdvantageInputs, algo: AlgoKnobs) -> tuple[Tensor, Tensor | None]:
    """Each sample's transformed reward on every one of its tokens; no returns."""
    return broadcast_to_tokens(x.rewards, x.response_lengths), None


def reinforce_plus_plus_advantages(x: AdvantageInputs, algo: AlgoKnobs) -> tuple[Tensor, Tensor | None]:
    """Discounted KL-shaped returns, used as the advantages and as the returns."""
    returns = reinforce_plus_plus_returns(
        x.rewards, x.kl, x.loss_mask, x.response_lengths, kl_coef=algo.kl_coef, gamma=algo.gamma
    )
    return returns, returns


def centred_minus_kl_advantages(x: AdvantageInputs, algo: AlgoKnobs) -> tuple[Tensor, Tensor | None]:
    """reinforce++-baseline: the centred reward minus kl_coef·kl on each token; no returns."""
    return reinforce_plus_plus_baseline_advantages(x.rewards, x.kl, x.response_lengths, kl_coef=algo.kl_coef), None


def gae_advantages(x: AdvantageInputs, algo: AlgoKnobs) -> tuple[Tensor, Tensor | None]:
    """GAE over the critic's values; returns = advantages + values."""
    if x.values is None:
        raise ValueError("ppo needs the critic's values")
    return gae(x.values, x.rewards, x.kl, x.response_lengths, kl_coef=algo.kl_coef, gamma=algo.gamma, lambd=algo.lambd)


def no_advantages(x: AdvantageInputs, algo: AlgoKnobs) -> tuple[Tensor, Tensor | None]:
    """Zeros: the loss reads no advantages (sft)."""
    return torch.zeros_like(x.loss_mask), None


# --- policy-gradient losses (docs/algorithms.md#policy-loss) ---


def clipped_surrogate_loss(x: PolicyLossInputs, algo: AlgoKnobs, log_ratio: Tensor | None = None) -> dict[str, Tensor]:
    """PPO's clipped surrogate on the per-token ratio exp(ℓ − ℓ_old), or on `log_ratio` when given."""
    clip = {"eps_clip": algo.eps_clip, "eps_clip_high": algo.eps_clip_high, "eps_clip_c": algo.eps_clip_c}
    return ppo_clip_loss(x.log_probs, x.old_log_probs, x.advantages, log_ratio=log_ratio, **clip)


def sequence_clipped_surrogate_loss(x: PolicyLossInputs, algo: AlgoKnobs) -> dict[str, Tensor]:
    """GSPO: the clipped surrogate on the sequence-level ratio (mean masked log-ratio of each sample)."""
    log_ratio = gspo_log_ratio(x.log_probs, x.old_log_probs, x.loss_mask, x.response_lengths)
    return clipped_surrogate_loss(x, algo, log_ratio)


def clipped_weight_loss(x: PolicyLossInputs, algo: AlgoKnobs) -> dict[str, Tensor]:
    """CISPO (MiniMax-M1): −sg(clip(ρ, 1−ε_l, 1+ε_h))·A·ℓ per token, so a clipped token keeps its gradient;
    ε_l ≥ 1 leaves the ratio unbounded below (the canonical one-sided setting)."""
    eps_high = algo.eps_clip if algo.eps_clip_high is None else algo.eps_clip_high
    return cispo_loss(x.log_probs, x.old_log_probs, x.advantages, eps_clip=algo.eps_clip, eps_clip_high=eps_high)


def negative_log_likelihood_loss(x: PolicyLossInputs, algo: AlgoKnobs) -> dict[str, Tensor]:
    """SFT: −ℓ on each token; no metrics."""
    return {"loss": sft_loss(x.log_probs)}
