"""CISPO (MiniMax-M1) as a new estimator's policy loss: the function tests/algo/test_estimators.py's CISPO record
names by import path, to show that a new estimator is one record plus its functions."""

from __future__ import annotations

from torch import Tensor

from slime.algo.estimator_functions import AlgoKnobs, PolicyLossInputs
from slime.algo.policy_loss import cispo_loss


def cispo_policy_loss(x: PolicyLossInputs, algo: AlgoKnobs) -> dict[str, Tensor]:
    """−sg(clip(ρ, 1−ε_l, 1+ε_h))·A·ℓ per token; a clipped token keeps its gradient."""
    eps_high = algo.eps_clip if algo.eps_clip_high is None else algo.eps_clip_high
    return cispo_loss(x.log_probs, x.old_log_probs, x.advantages, eps_clip=algo.eps_clip, eps_clip_high=eps_high)
