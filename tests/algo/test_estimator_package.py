"""An advantage estimator from outside the project: a package whose spec.py declares its record, chosen by the
package's import path (`algo.advantage_estimator=toy_estimator`), like an engine of a package of the user's."""

from __future__ import annotations

import pytest
import torch

from slime.algo.estimators import ESTIMATORS
from slime.plan.listing import listing
from slime.plan.validate import collect_problems
from tests.helpers.compose import typed_config

SPEC = """
from slime.algo.estimators import FUNCTIONS, Estimator

SPECS = (
    Estimator(
        name="toy",
        reward_transform=f"{FUNCTIONS}.group_centred_rewards",
        token_advantages=f"{FUNCTIONS}.broadcast_advantages",
        policy_loss=".loss.reinforce_policy_loss",
        min_samples_per_prompt=64,
    ).spec(),
)
"""
LOSS = "def reinforce_policy_loss(x, algo):\n    return {'loss': -x.advantages * x.log_probs}\n"


@pytest.fixture
def toy_estimator(tmp_path, monkeypatch) -> str:
    """The package `toy_estimator` (its spec.py and its loss module) importable for one test."""
    package = tmp_path / "toy_estimator"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "spec.py").write_text(SPEC)
    (package / "loss.py").write_text(LOSS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "toy_estimator"


def test_a_package_of_the_users_declares_an_estimator_by_its_spec(toy_estimator):
    record = ESTIMATORS.get(toy_estimator)
    assert record.name == toy_estimator and record.min_samples_per_prompt == 64 and not record.needs_critic
    assert record.policy_loss == "toy_estimator.loss.reinforce_policy_loss"  # relative to its package
    raw = torch.tensor([1.0, 0.0])
    torch.testing.assert_close(record.transform_rewards(raw, 2, None), torch.tensor([0.5, -0.5]))
    assert toy_estimator not in listing()  # --help lists the project's parts


def test_validation_accepts_it_and_runs_its_checks(toy_estimator):
    found = {p.key: str(p) for p in collect_problems(typed_config([f"algo.advantage_estimator={toy_estimator}"]))}
    assert "algo.advantage_estimator" not in found
    assert "at least 64 samples per prompt" in found["rollout.n_samples_per_prompt"]
