"""Advantages and returns for every estimator, on one rank's flat response tokens
(docs/algorithms.md#advantage-estimators).

Rewards arrive post-processed by the rollout manager (the estimator's `reward_transform`); the estimator's
record (`slime.algo.estimators`) turns them into per-token advantages.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from slime.algo.advantages import distillation_advantages, whiten
from slime.algo.estimator_functions import AdvantageInputs
from slime.algo.estimators import ESTIMATORS
from slime.algo.kl import approx_kl
from slime.config.schema import AlgoConfig


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
    teacher_log_probs: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Return (advantages Tensor[T], returns Tensor[T] or None, kl Tensor[T]): the estimator's token
    advantages, minus opd_kl_coef × the reverse KL to the teacher with algo.use_opd (before whitening, as
    slime), whitened over the step when algo.normalize_advantages and its loss reads them.

    kl is the reward-shaping KL between the old and reference policies (zero when kl_coef = 0).
    """
    estimator = ESTIMATORS.get(algo.advantage_estimator)
    if algo.kl_coef != 0:
        kl = approx_kl(old_log_probs, ref_log_probs, algo.kl_loss_type)
    else:
        kl = torch.zeros_like(loss_mask)
    inputs = AdvantageInputs(
        rewards=rewards, kl=kl, loss_mask=loss_mask, response_lengths=response_lengths, values=values
    )
    advantages, returns = estimator.advantages(inputs, algo)
    if algo.use_opd:
        if teacher_log_probs is None or old_log_probs is None:
            raise ValueError("algo.use_opd needs the student's and the teacher's log-probs of the batch")
        advantages, _ = distillation_advantages(advantages, old_log_probs, teacher_log_probs, kl_coef=algo.opd_kl_coef)
    if algo.normalize_advantages and estimator.uses_advantages:
        advantages = whiten(advantages, loss_mask, all_reduce=all_reduce)
    return advantages, returns, kl
