"""Per-token KL estimators (docs/algorithms.md#kl-estimators).

All tensors are any matching shape (usually flat Tensor[T] of log-probs in nats).
"""

from __future__ import annotations

import torch
from torch import Tensor

from slime.algo.choices import KL_TYPES


def approx_kl(
    log_probs: Tensor,
    ref_log_probs: Tensor,
    kl_type: str,
    *,
    importance_ratio: Tensor | None = None,
) -> Tensor:
    """Approximate per-token KL(π‖π_ref) from samples of π, in nats.

    With x = log_probs − ref_log_probs:
        k1 = x;  k2 = x²/2;  k3 = exp(−x) − 1 + x;  low_var_kl = clamp(k3, −10, 10).

    Args:
        log_probs, ref_log_probs: same-shape tensors of log-probs.
        kl_type: one of ``KL_TYPES``.
        importance_ratio: optional same-shape tensor (use_unbiased_kl, exp(ℓ − ℓ_old));
            the estimate is multiplied by it before the low_var_kl clamp.

    Returns:
        Tensor of the input shape and dtype.
    """
    if kl_type not in KL_TYPES:
        raise ValueError(f"unknown kl_type {kl_type!r}; valid: {', '.join(KL_TYPES)}")
    x = log_probs - ref_log_probs
    if kl_type == "k1":
        kl = x
    elif kl_type == "k2":
        kl = x.square() / 2
    else:
        kl = torch.exp(-x) - 1 + x
    if importance_ratio is not None:
        kl = kl * importance_ratio
    if kl_type == "low_var_kl":
        kl = kl.clamp(-10.0, 10.0)
    return kl
