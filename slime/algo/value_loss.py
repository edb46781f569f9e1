"""Clipped critic loss (docs/algorithms.md#value-loss). Per-token tensors are flat Tensor[T]."""

from __future__ import annotations

from torch import Tensor


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    *,
    value_clip: float,
) -> dict[str, Tensor]:
    """PPO value loss with value clipping (no ½ factor).

    V_clip = V_old + clip(V − V_old, −vc, vc); L = max((V_clip − R)², (V − R)²).

    Args:
        values: Tensor[T] current critic values; old_values, returns: Tensor[T].
    Returns:
        {"loss": L_t (with gradient), "clipfrac": 1[|V − V_old| > vc] (detached)}, Tensor[T].
    """
    delta = values - old_values
    clipped = old_values + delta.clamp(-value_clip, value_clip)
    loss = (clipped - returns).square().maximum((values - returns).square())
    return {"loss": loss, "clipfrac": (delta.abs() > value_clip).to(loss.dtype).detach()}
