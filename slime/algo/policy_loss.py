"""Per-token policy-gradient losses: PPO clip, GSPO, CISPO, SFT (docs/algorithms.md#policy-loss, #sft-loss); the
trainer-vs-engine corrections are in `slime.algo.off_policy`.

All per-token tensors are flat Tensor[T] (see ``slime.algo``); log-probs are in nats.
Every function returns un-reduced per-token values; masking and reduction belong to
``slime.algo.reduction``. In returned dicts only "loss" carries gradient; the metric
entries are detached.
"""

from __future__ import annotations

import torch
from torch import Tensor

from slime.algo._layout import check_flat, check_lengths, sample_ids, segment_sum


def ppo_clip_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
    log_ratio: Tensor | None = None,
) -> dict[str, Tensor]:
    """PPO clipped surrogate with asymmetric clip and optional dual clip.

    ρ = exp(log_ratio), log_ratio = ℓ − ℓ_old unless given (e.g. GSPO's s).
    L = max(−ρA, −clip(ρ, 1−ε_l, 1+ε_h)·A); with dual clip c > 1, L ← min(−cA, L) where A < 0.

    Args:
        log_probs, old_log_probs, advantages: Tensor[T].
        eps_clip: ε_l. eps_clip_high: ε_h (defaults to ε_l). eps_clip_c: dual-clip c (> 1).
        log_ratio: optional Tensor[T] used instead of ℓ − ℓ_old (gradient flows through it).

    Returns:
        {"loss": L_t, "clipfrac": 1.0 where the clipped term is strictly larger,
         "ppo_kl": −log_ratio, "ratio": ρ}, each Tensor[T].
    """
    if eps_clip_c is not None and not eps_clip_c > 1.0:
        raise ValueError(f"eps_clip_c must be > 1, got {eps_clip_c}")
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    if log_ratio is None:
        log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    pg1 = -ratio * advantages
    pg2 = -ratio.clamp(1.0 - eps_clip, 1.0 + eps_high) * advantages
    loss = torch.maximum(pg1, pg2)
    clipfrac = (pg2 > pg1).to(loss.dtype)
    if eps_clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(-eps_clip_c * advantages, loss), loss)
    return {
        "loss": loss,
        "clipfrac": clipfrac.detach(),
        "ppo_kl": (-log_ratio).detach(),
        "ratio": ratio.detach(),
    }


def gspo_log_ratio(
    log_probs: Tensor,
    old_log_probs: Tensor,
    loss_mask: Tensor,
    response_lengths: list[int],
) -> Tensor:
    """GSPO sequence-level log-ratio s_i = Σ m(ℓ − ℓ_old) / max(Σ m, 1), broadcast to tokens.

    Inputs must hold each sample's FULL response (gathered across context parallelism).
    Gradient flows through s to every masked token of the sample. Pass the result as
    ``ppo_clip_loss(..., log_ratio=s)``.

    Args:
        log_probs, old_log_probs, loss_mask: Tensor[T].
    Returns:
        Tensor[T].
    """
    lengths = check_lengths(response_lengths)
    for x, name in ((log_probs, "log_probs"), (old_log_probs, "old_log_probs"), (loss_mask, "loss_mask")):
        check_flat(x, lengths, name)
    m = loss_mask.to(log_probs.dtype)
    num = segment_sum(m * (log_probs - old_log_probs), lengths)
    den = segment_sum(m, lengths).clamp_min(1.0)
    return (num / den)[sample_ids(lengths, log_probs.device)]


def cispo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float,
) -> dict[str, Tensor]:
    """CISPO: L_t = −stopgrad(clip(ρ_t, 1−ε_l, 1+ε_h))·A_t·ℓ_t; clipped tokens keep gradient.

    Args:
        log_probs, old_log_probs, advantages: Tensor[T].
    Returns:
        {"loss", "clipfrac" (1.0 where the clamp changed ρ), "ppo_kl" (ℓ_old − ℓ), "ratio" (ρ)}.
    """
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    loss = -clipped.detach() * advantages * log_probs
    return {
        "loss": loss,
        "clipfrac": (clipped != ratio).to(loss.dtype).detach(),
        "ppo_kl": (-log_ratio).detach(),
        "ratio": ratio.detach(),
    }


def sft_loss(log_probs: Tensor) -> Tensor:
    """Per-token negative log-likelihood −ℓ_t (Tensor[T] in nats); reduce with the mask."""
    return -log_probs
