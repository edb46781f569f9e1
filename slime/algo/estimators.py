"""The algorithm registry: one record per advantage estimator (`algo.advantage_estimator`).

A record says everything that differs between estimators: how the rollout side transforms the per-sample
rewards, how the trainer turns them into per-token advantages, the policy-gradient loss, and what the
estimator needs (a critic, a forward pass for ℓ_old, whitening, several samples per prompt, generated
responses). Code that depends on the estimator reads the record (`ESTIMATORS.get(name)`) and never compares
its name. Adding an estimator is one `Estimator(...)` plus its functions, registered with
`ESTIMATORS.register`.

The functions take the algorithm's knobs duck-typed (`AlgoKnobs`: `slime.config.schema.AlgoConfig` in
practice); this package stays torch and the standard library only. Layout as in `slime.algo`: per-sample
tensors are Tensor[B], per-token tensors flat Tensor[T], T = sum(response_lengths); log-probs in nats.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable
from typing import Protocol

import torch
from torch import Tensor

from slime.algo.advantages import (
    broadcast_to_tokens,
    gae,
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_returns,
)
from slime.algo.policy_loss import gspo_log_ratio, ppo_clip_loss, sft_loss
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


RewardTransform = Callable[[Tensor, int, AlgoKnobs], Tensor]
TokenAdvantages = Callable[[AdvantageInputs, AlgoKnobs], tuple[Tensor, Tensor | None]]
PolicyLoss = Callable[[PolicyLossInputs, AlgoKnobs], dict[str, Tensor]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Estimator:
    """One advantage estimator.

    reward_transform(raw Tensor[N], n_samples_per_prompt, algo) -> Tensor[N]: the rollout side's per-sample
        rewards (groups are n consecutive samples); skipped when algo.disable_rewards_normalization.
    token_advantages(AdvantageInputs, algo) -> (advantages Tensor[T], returns Tensor[T] or None), before
        whitening (algo.normalize_advantages).
    policy_loss(PolicyLossInputs, algo) -> {"loss": un-reduced per-token loss with gradient, and optionally
        detached per-token metrics "clipfrac", "ppo_kl", "ratio"}.
    needs_critic: a value model is trained alongside (its values feed token_advantages).
    needs_old_log_probs: the loss reads ℓ_old beyond stopgrad(ℓ), so a forward-only pass computes it even
        with one optimizer step per rollout.
    reward_kl: KL goes in the reward (algo.kl_coef shapes the advantages); the others take KL only as a
        loss term (algo.use_kl_loss).
    needs_whitening: advantages are meaningful only whitened (algo.normalize_advantages must be true).
    uses_advantages: the policy loss reads advantages (whitening them is skipped otherwise).
    generates: the policy generates the responses it learns from; False (SFT) reads them from the data,
        so there are no engine log-probs, no reward and nothing to evaluate.
    min_samples_per_prompt: the smallest rollout.n_samples_per_prompt the reward transform accepts.
    rollout_function: the `rollout.function` registry name used when rollout.function is null.
    """

    name: str
    reward_transform: RewardTransform
    token_advantages: TokenAdvantages
    policy_loss: PolicyLoss
    needs_critic: bool = False
    needs_old_log_probs: bool = False
    reward_kl: bool = False
    needs_whitening: bool = False
    uses_advantages: bool = True
    generates: bool = True
    min_samples_per_prompt: int = 1
    rollout_function: str = "default"


# --- reward transforms (rollout side; REFERENCE §3.1-3.2) ---


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


# --- token advantages (train side; REFERENCE §3.2-3.3) ---


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


# --- policy-gradient losses (REFERENCE §3.5-3.6) ---


def clipped_surrogate_loss(x: PolicyLossInputs, algo: AlgoKnobs) -> dict[str, Tensor]:
    """PPO's clipped surrogate on the per-token ratio exp(ℓ − ℓ_old)."""
    return ppo_clip_loss(
        x.log_probs,
        x.old_log_probs,
        x.advantages,
        eps_clip=algo.eps_clip,
        eps_clip_high=algo.eps_clip_high,
        eps_clip_c=algo.eps_clip_c,
    )


def sequence_clipped_surrogate_loss(x: PolicyLossInputs, algo: AlgoKnobs) -> dict[str, Tensor]:
    """GSPO: the clipped surrogate on the sequence-level ratio (mean masked log-ratio of each sample)."""
    return ppo_clip_loss(
        x.log_probs,
        x.old_log_probs,
        x.advantages,
        eps_clip=algo.eps_clip,
        eps_clip_high=algo.eps_clip_high,
        eps_clip_c=algo.eps_clip_c,
        log_ratio=gspo_log_ratio(x.log_probs, x.old_log_probs, x.loss_mask, x.response_lengths),
    )


def negative_log_likelihood_loss(x: PolicyLossInputs, algo: AlgoKnobs) -> dict[str, Tensor]:
    """SFT: −ℓ on each token; no metrics."""
    return {"loss": sft_loss(x.log_probs)}


# --- the registry ---


class EstimatorRegistry:
    """Estimator records by name, for the config key `algo.advantage_estimator`.

    Same reading surface as `slime.registry.Registry` (key, names, `in`, unknown_message), so validation and
    `--help` list these names like every other seam's.
    """

    key = "algo.advantage_estimator"
    what = "advantage estimator"

    def __init__(self, records: Iterable[Estimator]):
        self._records: dict[str, Estimator] = {}
        for record in records:
            self.register(record)

    def register(self, record: Estimator) -> None:
        """Add `record`; ValueError when its name is taken (unregister the old one first)."""
        if record.name in self._records:
            raise ValueError(f"{self.what} {record.name!r} is already registered")
        self._records[record.name] = record

    def unregister(self, name: str) -> Estimator:
        """Remove and return the record of `name` (ValueError naming the choices when there is none)."""
        record = self.get(name)
        del self._records[name]
        return record

    def get(self, name: str) -> Estimator:
        """The record of `name`; ValueError naming the registered ones (and the closest) otherwise."""
        record = self.find(name)
        if record is None:
            raise ValueError(self.unknown_message(name))
        return record

    def find(self, name: object) -> Estimator | None:
        """The record of `name`, or None: for code that must tolerate a name validation reports (derive)."""
        return self._records.get(name)  # type: ignore[arg-type]

    def names(self, where: Callable[[Estimator], bool] | None = None) -> list[str]:
        """The registered names, sorted; with `where`, those whose record satisfies it."""
        return sorted(name for name, record in self._records.items() if where is None or where(record))

    def __contains__(self, name: object) -> bool:
        return name in self._records

    def unknown_message(self, name: object) -> str:
        close = difflib.get_close_matches(str(name), self.names(), n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        return f"unknown {self.what} {name!r}{hint}; registered: {', '.join(self.names())}"


GRPO = Estimator(
    name="grpo",
    reward_transform=group_normalized_rewards,
    token_advantages=broadcast_advantages,
    policy_loss=clipped_surrogate_loss,
)
GSPO = Estimator(
    name="gspo",
    reward_transform=group_normalized_rewards,
    token_advantages=broadcast_advantages,
    policy_loss=sequence_clipped_surrogate_loss,
    needs_old_log_probs=True,
)
RLOO = Estimator(
    name="rloo",
    reward_transform=leave_one_out_rewards,
    token_advantages=broadcast_advantages,
    policy_loss=clipped_surrogate_loss,
    min_samples_per_prompt=2,
)
REINFORCE_PLUS_PLUS = Estimator(
    name="reinforce_plus_plus",
    reward_transform=raw_rewards,
    token_advantages=reinforce_plus_plus_advantages,
    policy_loss=clipped_surrogate_loss,
    reward_kl=True,
    needs_whitening=True,
)
REINFORCE_PLUS_PLUS_BASELINE = Estimator(
    name="reinforce_plus_plus_baseline",
    reward_transform=group_centred_rewards,
    token_advantages=centred_minus_kl_advantages,
    policy_loss=clipped_surrogate_loss,
    reward_kl=True,
    needs_whitening=True,
)
PPO = Estimator(
    name="ppo",
    reward_transform=raw_rewards,
    token_advantages=gae_advantages,
    policy_loss=clipped_surrogate_loss,
    needs_critic=True,
    needs_old_log_probs=True,
    reward_kl=True,
)
SFT = Estimator(
    name="sft",
    reward_transform=raw_rewards,
    token_advantages=no_advantages,
    policy_loss=negative_log_likelihood_loss,
    uses_advantages=False,
    generates=False,
    rollout_function="sft",
)

ESTIMATORS = EstimatorRegistry((GRPO, GSPO, RLOO, REINFORCE_PLUS_PLUS, REINFORCE_PLUS_PLUS_BASELINE, PPO, SFT))
