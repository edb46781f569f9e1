"""Per-token advantages and returns (docs/algorithms.md#advantage-estimators, #advantage-whitening).

Layout: per-token tensors are flat Tensor[T], T = sum(response_lengths); per-sample
tensors are Tensor[B]. Rewards are unitless; kl is per-token KL in nats (docs/algorithms.md#kl-estimators).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from slime.algo._layout import (
    check_flat,
    check_lengths,
    check_per_sample,
    pad,
    reverse_discounted_cumsum,
    sample_ids,
    segment_sum,
    unpad,
)


def broadcast_to_tokens(per_sample: Tensor, response_lengths: list[int]) -> Tensor:
    """Copy sample i's value onto each of its response tokens (GRPO/GSPO/CISPO/RLOO).

    Args:
        per_sample: Tensor[B].
    Returns:
        Tensor[T].
    """
    lengths = check_lengths(response_lengths)
    check_per_sample(per_sample, lengths, "per_sample")
    return per_sample[sample_ids(lengths, per_sample.device)]


def reinforce_plus_plus_returns(
    rewards: Tensor,
    kl: Tensor,
    loss_mask: Tensor,
    response_lengths: list[int],
    *,
    kl_coef: float,
    gamma: float,
) -> Tensor:
    """REINFORCE++ discounted returns, used as advantages (whiten them afterwards).

    ρ_t = −kl_coef·kl_t·m_t, plus r_i at sample i's LAST token with m_t = 1;
    G_t = Σ_{k≥t} γ^(k−t)·ρ_k within the sample.

    Args:
        rewards: Tensor[B] raw rewards.
        kl, loss_mask: Tensor[T]; loss_mask is 0/1.
    Returns:
        Tensor[T]. Raises ValueError if any sample's mask is all zero.
    """
    lengths = check_lengths(response_lengths)
    check_per_sample(rewards, lengths, "rewards")
    check_flat(kl, lengths, "kl")
    check_flat(loss_mask, lengths, "loss_mask")
    counts = segment_sum(loss_mask.to(kl.dtype), lengths)
    bad = (counts == 0).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"samples {bad} have an all-zero loss_mask; reinforce++ needs a last masked token")
    if not lengths:
        return kl.new_zeros(0)
    mask = pad(loss_mask.to(kl.dtype), lengths)  # [B, L]
    rho = -kl_coef * pad(kl, lengths) * mask
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).amax(dim=1)
    onehot = (positions == last[:, None]).to(rho.dtype)
    rho = rho + onehot * rewards.to(rho.dtype)[:, None]
    return unpad(reverse_discounted_cumsum(rho, gamma), lengths)


def reinforce_plus_plus_baseline_advantages(
    centred_rewards: Tensor,
    kl: Tensor,
    response_lengths: list[int],
    *,
    kl_coef: float,
) -> Tensor:
    """REINFORCE++-baseline: A_t = r̃_i − kl_coef·kl_t (whiten afterwards).

    Args:
        centred_rewards: Tensor[B], already group-mean-centred (no std division).
        kl: Tensor[T].
    Returns:
        Tensor[T].
    """
    lengths = check_lengths(response_lengths)
    check_flat(kl, lengths, "kl")
    return broadcast_to_tokens(centred_rewards, lengths) - kl_coef * kl


def gae(
    values: Tensor,
    rewards: Tensor,
    kl: Tensor,
    response_lengths: list[int],
    *,
    kl_coef: float,
    gamma: float,
    lambd: float,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over every response token (masked ones included).

    ρ_t = −kl_coef·kl_t, plus r_i at the final index of sample i;
    δ_t = ρ_t + γ·V_{t+1} − V_t with V = 0 past the end; A_t = Σ_k (γλ)^k·δ_{t+k};
    R_t = A_t + V_t.

    Args:
        values: Tensor[T] critic values (old critic, not temperature-scaled).
        rewards: Tensor[B]; kl: Tensor[T].
    Returns:
        (advantages Tensor[T], returns Tensor[T]). Raises ValueError on a zero-length
        response (the reward has nowhere to go).
    """
    lengths = check_lengths(response_lengths)
    if any(n == 0 for n in lengths):
        raise ValueError(f"gae needs non-empty responses, got response_lengths={lengths}")
    check_per_sample(rewards, lengths, "rewards")
    check_flat(values, lengths, "values")
    check_flat(kl, lengths, "kl")
    v = pad(values, lengths)  # [B, L], zero past the end
    rho = -kl_coef * pad(kl.to(values.dtype), lengths)
    last = torch.tensor(lengths, device=v.device) - 1
    positions = torch.arange(v.shape[1], device=v.device).expand_as(v)
    rho = rho + (positions == last[:, None]).to(v.dtype) * rewards.to(v.dtype)[:, None]
    v_next = torch.cat([v[:, 1:], v.new_zeros(v.shape[0], 1)], dim=1)
    valid = (positions <= last[:, None]).to(v.dtype)
    delta = (rho + gamma * v_next - v) * valid
    adv = unpad(reverse_discounted_cumsum(delta, gamma * lambd), lengths)
    return adv, adv + values


def whiten(
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    all_reduce: Callable[[Tensor], Tensor] | None = None,
    eps: float = 1e-8,
) -> Tensor:
    """Whiten advantages over every masked token of the step (all ranks, all micro-batches).

    Stats s = [Σm·A, Σm·A², N = Σm] are passed through ``all_reduce`` (a callable returning
    them summed over data-parallel ranks) when given. μ = Σm·A/N;
    σ² = (Σm·A²/N − μ²)·N/(N−1) if N ≥ 2; A' = (A − μ)/√(σ² + eps) on every token.

    Args:
        advantages, loss_mask: Tensor[T] (this rank's tokens).
    Returns:
        Tensor[T]. Raises ValueError when N == 0.
    """
    if advantages.shape != loss_mask.shape:
        raise ValueError(f"shape mismatch: {tuple(advantages.shape)} vs {tuple(loss_mask.shape)}")
    m = loss_mask.to(advantages.dtype)
    stats = torch.stack([(m * advantages).sum(), (m * advantages.square()).sum(), m.sum()])
    if all_reduce is not None:
        stats = all_reduce(stats)
    n = float(stats[2])
    if n <= 0:
        raise ValueError("whiten: no masked tokens (N == 0) across the step")
    mean = stats[0] / n
    var = stats[1] / n - mean.square()
    if n >= 2:
        var = var * (n / (n - 1))
    return (advantages - mean) * torch.rsqrt(var.clamp_min(0) + eps)


def reverse_kl(student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
    """Tensor[T]: the per-token estimate ℓ_student − ℓ_teacher (nats) of KL(student ‖ teacher) on the student's own
    samples, without gradient."""
    return (student_log_probs - teacher_log_probs).detach()


def distillation_advantages(
    advantages: Tensor, student_log_probs: Tensor, teacher_log_probs: Tensor, *, kl_coef: float
) -> tuple[Tensor, Tensor]:
    """On-policy distillation (slime's apply_opd_kl_to_advantages, after tinker-cookbook): A_t − kl_coef·k_t with
    k_t the `reverse_kl` estimate.

    All Tensor[T] (nats); returns (advantages, reverse_kl), both without gradient."""
    k = reverse_kl(student_log_probs, teacher_log_probs)
    return advantages - kl_coef * k, k
