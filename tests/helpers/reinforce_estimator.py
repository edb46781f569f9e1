"""Vanilla REINFORCE (−A·ℓ per token, no ratio) as a new estimator's policy loss: the function
tests/algo/test_estimators.py's test-only record names by import path, to show that a new estimator is one record
plus its functions."""

from __future__ import annotations

from torch import Tensor

from slime.algo.estimator_functions import AlgoKnobs, PolicyLossInputs


def reinforce_policy_loss(x: PolicyLossInputs, algo: AlgoKnobs) -> dict[str, Tensor]:
    """−A_t·ℓ_t per token (the on-policy gradient estimator, without PPO's ratio or clip)."""
    return {"loss": -x.advantages * x.log_probs}
