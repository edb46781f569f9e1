"""Corrections for tokens the trainer's policy did not sample itself (docs/algorithms.md#importance-weights-tis):
importance weights between
the trainer and the engine (TIS at token, sequence or geometric-mean level), off-policy sequence masking (OPSM),
and the per-token terms of the trainer-vs-engine mismatch metrics.

Layout as in `slime.algo`: flat Tensor[T] per token, `response_lengths` hold each sample's FULL response (the
trainers gather context-parallel shards before the loss), log-probs in nats. Everything returned is detached:
these are weights, masks and metrics, never a path for the gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from slime.algo._layout import check_flat, check_lengths, sample_ids, segment_sum
from slime.algo.choices import TIS_LEVELS, TIS_MODES

# |log ratio| bound before exp, as slime's examples/train_infer_mismatch_helper/mis.py (compute_mis_weights,
# SAFETY_BOUND): a sequence-level log ratio sums a whole response and would overflow otherwise
LOG_RATIO_BOUND = 20.0


def sample_means(x: Tensor, loss_mask: Tensor, response_lengths: list[int]) -> Tensor:
    """Tensor[T] -> Tensor[B]: each sample's mean of x over its masked tokens (0 for a sample with none)."""
    m = loss_mask.to(x.dtype)
    return segment_sum(m * x, response_lengths) / segment_sum(m, response_lengths).clamp_min(1.0)


def tis_log_ratio(
    old_log_probs: Tensor, rollout_log_probs: Tensor, loss_mask: Tensor, response_lengths: list[int], level: str
) -> Tensor:
    """Tensor[T] log importance ratio trainer / engine at `level` (slime's mis.py compute_mis_weights levels):
    "token": ℓ_old − ℓ_roll per token; "sequence": its masked sum over the sample (the product of the token
    ratios); "geometric": its masked mean (their geometric mean). Sample-level values sit on every token."""
    if level not in TIS_LEVELS:
        raise ValueError(f"unknown TIS level {level!r}; valid: {', '.join(TIS_LEVELS)}")
    diff = (old_log_probs - rollout_log_probs).detach()
    if level == "token":
        return diff
    lengths = check_lengths(response_lengths)
    for x, name in ((diff, "log-prob difference"), (loss_mask, "loss_mask")):
        check_flat(x, lengths, name)
    m = loss_mask.to(diff.dtype)
    per_sample = segment_sum(m * diff, lengths) if level == "sequence" else sample_means(diff, m, lengths)
    return per_sample[sample_ids(lengths, diff.device)]


def tis_weights(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    mode: str = "truncate",
    level: str = "token",
    loss_mask: Tensor | None = None,
    response_lengths: list[int] | None = None,
) -> dict[str, Tensor]:
    """Trainer-vs-engine importance weights; multiply the per-token pg loss by "weights".

    ratio = exp(clamp(log ratio at `level`, ±20)) (`tis_log_ratio`; loss_mask and response_lengths are needed
    for the sample levels). "truncate": w = clamp(ratio, low, high) (slime's truncate with low = 0, its clip
    otherwise); "icepop": w = ratio inside [low, high], else 0 (slime's mask mode, MIS).

    Returns (all detached, Tensor[T]): {"weights": w, "ratio": the unclipped ratio, "clipfrac": 1.0 where
    w != ratio (clamped or zeroed), "abs": |ratio − 1|}.
    """
    if mode not in TIS_MODES:
        raise ValueError(f"unknown TIS mode {mode!r}; valid: {', '.join(TIS_MODES)}")
    if loss_mask is None:
        loss_mask = torch.ones_like(old_log_probs)
    if response_lengths is None:
        response_lengths = [old_log_probs.numel()]
    log_ratio = tis_log_ratio(old_log_probs, rollout_log_probs, loss_mask, response_lengths, level)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    outside = (ratio < clip_low) | (ratio > clip_high)
    if mode == "truncate":
        weights = ratio.clamp(clip_low, clip_high)
    else:
        weights = torch.where(outside, torch.zeros_like(ratio), ratio)
    return {
        "weights": weights,
        "ratio": ratio,
        "clipfrac": outside.to(ratio.dtype),
        "abs": (ratio - 1.0).abs(),
    }


def opsm_mask(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    response_lengths: list[int],
    *,
    delta: float,
) -> dict[str, Tensor]:
    """Off-policy sequence masking (slime's ppo_utils.compute_opsm_mask): a token's loss is dropped when its
    advantage is negative and its sample has drifted from the old policy, i.e. the sample's masked mean of
    ℓ_old − ℓ exceeds `delta` (nats).

    Returns (detached, Tensor[T]): {"keep": 0/1 to multiply the per-token loss by, "masked": 1 − keep}.
    """
    lengths = check_lengths(response_lengths)
    for x, name in ((log_probs, "log_probs"), (old_log_probs, "old_log_probs"), (advantages, "advantages")):
        check_flat(x, lengths, name)
    drift = sample_means((old_log_probs - log_probs).detach(), loss_mask, lengths)
    drifted = (drift > delta)[sample_ids(lengths, log_probs.device)]
    masked = ((advantages < 0) & drifted).to(log_probs.dtype)
    return {"keep": 1.0 - masked, "masked": masked}


def mismatch_terms(old_log_probs: Tensor, rollout_log_probs: Tensor) -> dict[str, Tensor]:
    """Per-token terms of the trainer-vs-engine mismatch metrics (detached, Tensor[T]); reduced per sample and
    averaged they are slime's add_ppl_metrics (examples/train_infer_mismatch_helper/mis.py):
    "train_rollout_logprob_abs_diff" |ℓ_old − ℓ_roll|; "mismatch_kl" ℓ_roll − ℓ_old (KL(engine ‖ trainer),
    direct estimator); "mismatch_k3_kl" r − log r − 1 with r = exp(ℓ_old − ℓ_roll); "training_log_ppl" −ℓ_old
    and "rollout_log_ppl" −ℓ_roll (per-sample means: the log perplexities)."""
    old, roll = old_log_probs.detach(), rollout_log_probs.detach()
    log_ratio = old - roll
    return {
        "train_rollout_logprob_abs_diff": log_ratio.abs(),
        "mismatch_kl": roll - old,
        "mismatch_k3_kl": torch.exp(log_ratio) - log_ratio - 1.0,
        "training_log_ppl": -old,
        "rollout_log_ppl": -roll,
    }
