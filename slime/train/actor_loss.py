"""The actor's loss for one micro-batch, assembled from `slime.algo` (shared by every backend).

loss = pg_loss − entropy_coef·entropy_loss + kl_loss_coef·kl_loss (REFERENCE.md §3.8), each term
reduced with step-level token weights, so summing micro-batch values over micro-batches and ranks
gives the step value exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from slime.algo import approx_kl, ppo_clip_loss, reduce
from slime.config.schema import AlgoConfig


def reduction_mode(algo: AlgoConfig) -> str:
    """per_token with calculate_per_token_loss, else per_sample (REFERENCE.md §3.11)."""
    return "per_token" if algo.calculate_per_token_loss else "per_sample"


def needs_entropy(algo: AlgoConfig) -> bool:
    return algo.entropy_coef != 0


def needs_ref(algo: AlgoConfig) -> bool:
    return algo.use_kl_loss or algo.kl_coef != 0


def actor_loss(
    *,
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    weights: Tensor,
    algo: AlgoConfig,
    entropy: Tensor | None = None,
    ref_log_probs: Tensor | None = None,
    rollout_log_probs: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """All per-token inputs are flat Tensor[T] over this micro-batch's response tokens.

    Returns the scalar loss (with gradient) and detached scalar metrics named as in REFERENCE.md §3.13
    (without the `train/` prefix), each already weighted so it sums across micro-batches and ranks.
    """
    pg = ppo_clip_loss(
        log_probs, old_log_probs, advantages,
        eps_clip=algo.eps_clip, eps_clip_high=algo.eps_clip_high, eps_clip_c=algo.eps_clip_c,
    )
    pg_loss = reduce(pg["loss"], weights)
    loss = pg_loss
    metrics = {
        "pg_loss": pg_loss.detach(),
        "pg_clipfrac": reduce(pg["clipfrac"], weights),
        "ppo_kl": reduce(pg["ppo_kl"], weights),
    }
    if entropy is not None:
        entropy_loss = reduce(entropy, weights)
        loss = loss - algo.entropy_coef * entropy_loss
        metrics["entropy_loss"] = entropy_loss.detach()
    if algo.use_kl_loss:
        if ref_log_probs is None:
            raise ValueError("algo.use_kl_loss needs reference log-probs")
        kl_loss = reduce(approx_kl(log_probs, ref_log_probs, algo.kl_loss_type), weights)
        loss = loss + algo.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    if rollout_log_probs is not None:
        metrics["train_rollout_logprob_abs_diff"] = reduce((old_log_probs - rollout_log_probs).abs(), weights).detach()
    metrics["loss"] = loss.detach()
    return loss, metrics


def sum_metrics(into: dict[str, Tensor], new: dict[str, Tensor]) -> None:
    """Accumulate weighted micro-batch metrics (they are partial sums of the step value)."""
    for key, value in new.items():
        into[key] = into.get(key, torch.zeros((), dtype=value.dtype, device=value.device)) + value.detach()
