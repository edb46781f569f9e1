"""Per-sample reward post-processing and RLOO (docs/algorithms.md#reward-post-processing).

Inputs are 1-D tensors of N per-sample scalar rewards (unitless), ordered so that the
n_samples_per_prompt samples of one prompt are contiguous: rows ``[g*n, (g+1)*n)``.
"""

from __future__ import annotations

from torch import Tensor


def _groups(rewards: Tensor, n: int) -> Tensor:
    """Reshape Tensor[N] into Tensor[N // n, n]; raise ValueError if N is not a multiple of n."""
    if n < 1:
        raise ValueError(f"n_samples_per_prompt must be >= 1, got {n}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(rewards.shape)}")
    if rewards.numel() % n != 0:
        raise ValueError(
            f"number of rewards ({rewards.numel()}) is not a multiple of "
            f"n_samples_per_prompt ({n}); refusing to treat the batch as one group"
        )
    return rewards.reshape(-1, n)


def group_normalize(
    rewards: Tensor,
    n_samples_per_prompt: int,
    *,
    subtract_mean: bool = True,
    divide_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO-style group normalisation of per-sample rewards.

    Args:
        rewards: Tensor[N], N a multiple of ``n_samples_per_prompt`` (= n).
        subtract_mean: r̃_i = r_i − mean of its group.
        divide_std: divide by (s + eps), s the group's sample std (Bessel, n − 1).
            Forced off when n == 1. Identical rewards give 0, never NaN.
        eps: added to the std (not the variance).

    Returns:
        Tensor[N] in the input dtype.
    """
    n = n_samples_per_prompt
    groups = _groups(rewards, n)
    out = groups
    if subtract_mean:
        out = out - groups.mean(dim=1, keepdim=True)
    if divide_std and n > 1:
        out = out / (groups.std(dim=1, correction=1, keepdim=True) + eps)
    return out.reshape(-1)


def rloo_advantages(rewards: Tensor, n_samples_per_prompt: int) -> Tensor:
    """Leave-one-out baseline: A_i = r_i − mean_{j≠i} r_j = n/(n−1)·(r_i − mean_group).

    Args:
        rewards: Tensor[N], N a multiple of n; n must be >= 2.

    Returns:
        Tensor[N].
    """
    n = n_samples_per_prompt
    if n < 2:
        raise ValueError(f"rloo needs n_samples_per_prompt >= 2, got {n}")
    groups = _groups(rewards, n)
    return ((groups - groups.mean(dim=1, keepdim=True)) * (n / (n - 1))).reshape(-1)
