"""Advantages and returns for every estimator, on one rank's flat response tokens (REFERENCE.md §3.2-3.3).

Rewards arrive post-processed by the rollout manager (group-normalised for grpo/gspo, leave-one-out
for rloo, mean-centred for reinforce_plus_plus_baseline, raw for reinforce_plus_plus and ppo).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from slime.algo import (
    approx_kl,
    broadcast_to_tokens,
    gae,
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_returns,
    whiten,
)
from slime.config.schema import AlgoConfig

BROADCAST_ESTIMATORS = ("grpo", "gspo", "rloo")


def compute_advantages(
    algo: AlgoConfig,
    *,
    rewards: Tensor,
    response_lengths: list[int],
    loss_mask: Tensor,
    old_log_probs: Tensor | None,
    ref_log_probs: Tensor | None,
    values: Tensor | None,
    all_reduce: Callable[[Tensor], Tensor] | None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Return (advantages Tensor[T], returns Tensor[T] or None, kl Tensor[T]).

    kl is the reward-shaping KL between the old and reference policies (zero when kl_coef = 0).
    """
    estimator = algo.advantage_estimator
    if algo.kl_coef != 0:
        kl = approx_kl(old_log_probs, ref_log_probs, algo.kl_loss_type)
    else:
        kl = torch.zeros_like(loss_mask)
    returns = None
    if estimator in BROADCAST_ESTIMATORS:
        advantages = broadcast_to_tokens(rewards, response_lengths)
    elif estimator == "reinforce_plus_plus":
        advantages = returns = reinforce_plus_plus_returns(
            rewards, kl, loss_mask, response_lengths, kl_coef=algo.kl_coef, gamma=algo.gamma
        )
    elif estimator == "reinforce_plus_plus_baseline":
        advantages = reinforce_plus_plus_baseline_advantages(rewards, kl, response_lengths, kl_coef=algo.kl_coef)
    elif estimator == "ppo":
        if values is None:
            raise ValueError("ppo needs the critic's values")
        advantages, returns = gae(
            values, rewards, kl, response_lengths, kl_coef=algo.kl_coef, gamma=algo.gamma, lambd=algo.lambd
        )
    elif estimator == "sft":
        return torch.zeros_like(loss_mask), None, kl
    else:
        raise ValueError(f"algo.advantage_estimator={estimator!r} is not implemented")
    if algo.normalize_advantages:
        advantages = whiten(advantages, loss_mask, all_reduce=all_reduce)
    return advantages, returns, kl
