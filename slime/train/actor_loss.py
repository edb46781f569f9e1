"""The actor's loss for one micro-batch, assembled from `slime.algo` (shared by every backend).

loss = pg_loss − entropy_coef·entropy_loss + kl_loss_coef·kl_loss (docs/algorithms.md#total-actor-loss), each term
reduced with step-level token weights, so summing micro-batch values over micro-batches and ranks
gives the step value exactly. The estimator's record chooses pg_loss (SFT: the masked negative log-likelihood).
"""

from __future__ import annotations

import torch
from torch import Tensor

from slime.algo.estimator_functions import PolicyLossInputs
from slime.algo.estimators import ESTIMATORS
from slime.algo.kl import approx_kl
from slime.algo.off_policy import mismatch_terms, opsm_mask, tis_weights
from slime.algo.reduction import reduce
from slime.config.schema import AlgoConfig

# the per-token metrics a policy loss may return, and the names they are logged under (docs/tracking.md#metrics)
POLICY_LOSS_METRICS = (("clipfrac", "pg_clipfrac"), ("ppo_kl", "ppo_kl"))


def reduction_mode(algo: AlgoConfig) -> str:
    """per_token with calculate_per_token_loss, else per_sample (docs/algorithms.md#loss-reduction)."""
    return "per_token" if algo.calculate_per_token_loss else "per_sample"


def actor_loss(
    *,
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    weights: Tensor,
    pg_weights: Tensor,
    algo: AlgoConfig,
    loss_mask: Tensor,
    response_lengths: list[int],
    entropy: Tensor | None = None,
    ref_log_probs: Tensor | None = None,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """All per-token inputs are flat Tensor[T] over this micro-batch's response tokens.

    `weights` reduce every term; `pg_weights` reduce the policy-gradient term only (they differ for
    Dr.GRPO's constant-length reducer). Returns the scalar loss (with gradient) and detached scalar
    metrics named as in docs/tracking.md#metrics without the `train/` prefix, each a partial sum of the
    step value.
    """
    pg_loss, metrics = _policy_gradient_loss(
        log_probs, old_log_probs, advantages, weights, pg_weights, algo, loss_mask, response_lengths, rollout_log_probs
    )
    metrics["pg_loss"] = pg_loss.detach()
    loss = pg_loss
    if entropy is not None:  # always logged; a gradient only with entropy_coef != 0
        entropy_loss = reduce(entropy if algo.entropy_coef else entropy.detach(), weights)
        if algo.entropy_coef:
            loss = loss - algo.entropy_coef * entropy_loss
        metrics["entropy_loss"] = entropy_loss.detach()
    if algo.use_kl_loss:
        kl_loss = reduce(approx_kl(log_probs, ref_log_probs, algo.kl_loss_type), weights)
        loss = loss + algo.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    if rollout_log_probs is not None:
        terms = mismatch_terms(old_log_probs, rollout_log_probs)
        metrics.update({name: reduce(term, weights) for name, term in terms.items()})
    metrics["loss"] = loss.detach()
    return loss, metrics


def _policy_gradient_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    weights: Tensor,
    pg_weights: Tensor,
    algo: AlgoConfig,
    loss_mask: Tensor,
    response_lengths: list[int],
    rollout_log_probs: Tensor | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The estimator's policy-gradient term (SFT's NLL, the clipped surrogate, GSPO's on the sequence ratio, CISPO's
    clipped weights) with OPSM's mask and TIS weights, reduced by `pg_weights`, and its metrics (clip fractions,
    PPO KL, the fraction OPSM dropped, TIS ratios)."""
    metrics: dict[str, Tensor] = {}
    inputs = PolicyLossInputs(
        log_probs=log_probs,
        old_log_probs=old_log_probs,
        advantages=advantages,
        loss_mask=loss_mask,
        response_lengths=response_lengths,
    )
    pg = ESTIMATORS.get(algo.advantage_estimator).loss(inputs, algo)
    per_token = pg["loss"]
    if algo.use_opsm:
        opsm = opsm_mask(log_probs, old_log_probs, advantages, loss_mask, response_lengths, delta=algo.opsm_delta)
        per_token = per_token * opsm["keep"]
        metrics["opsm_clipfrac"] = reduce(opsm["masked"], weights)
    if algo.use_tis:
        tis = tis_weights(
            old_log_probs,
            rollout_log_probs,
            clip_low=algo.tis_clip_low,
            clip_high=algo.tis_clip,
            mode=algo.tis_mode,
            level=algo.tis_level,
            loss_mask=loss_mask,
            response_lengths=response_lengths,
        )
        per_token = per_token * tis["weights"]
        metrics.update(
            tis=reduce(tis["ratio"], weights),
            tis_clipfrac=reduce(tis["clipfrac"], weights),
            tis_abs=reduce(tis["abs"], weights),
            ois=reduce(pg["ratio"], weights),
        )
    pg_loss = reduce(per_token, pg_weights)
    metrics.update({name: reduce(pg[key], weights) for key, name in POLICY_LOSS_METRICS if key in pg})
    return pg_loss, metrics


def sum_metrics(into: dict[str, Tensor], new: dict[str, Tensor]) -> None:
    """Accumulate weighted micro-batch metrics (they are partial sums of the step value)."""
    for key, value in new.items():
        into[key] = into.get(key, torch.zeros((), dtype=value.dtype, device=value.device)) + value.detach()
