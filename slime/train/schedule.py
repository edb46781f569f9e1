"""Learning-rate schedule over optimizer steps: linear warm-up, then constant, linear or cosine decay."""

from __future__ import annotations

import math


def lr_factor(step: int, *, total_steps: int, warmup_steps: int, style: str, lr: float, min_lr: float) -> float:
    """Multiplier of `lr` at optimizer step `step` (0-based); decays to min_lr at total_steps."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if style == "constant":
        return 1.0
    progress = min(max(step - warmup_steps, 0) / max(total_steps - warmup_steps, 1), 1.0)
    floor = min_lr / lr
    if style == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    if style == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"train.lr_decay_style={style!r}: expected constant, linear or cosine")
