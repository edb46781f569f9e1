"""The advantage estimators as code reads them: one `Estimator` record per `algo.advantage_estimator`, from the
registry slime.registry.ADVANTAGE_ESTIMATORS, whose records slime/algo/spec.py declares (a package outside the project
declares its own in its spec.py and is chosen by its import path, as any part is).

A record says everything that differs between estimators: how the rollout side transforms the per-sample
rewards, how the trainer turns them into per-token advantages, the policy-gradient loss (import paths of the
functions, `slime.algo.estimator_functions` for the built-in ones), and what the estimator needs (its facts,
slime.registry.EstimatorFacts). Code that depends on the estimator reads the record (`ESTIMATORS.get(name)`) and
never compares its name.

The functions are import paths resolved on first use, so this module imports no torch: validation, the dry run and
the driver read the records without it.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any, Optional

from slime.algo.check import ESTIMATOR_CHECKS
from slime.registry import ADVANTAGE_ESTIMATORS, EstimatorFacts, Registry, Spec

FUNCTIONS = "slime.algo.estimator_functions"
ROLES = ("reward_transform", "token_advantages", "policy_loss")  # the functions' roles in a record's Spec target


@dataclasses.dataclass(frozen=True, kw_only=True)
class Estimator(EstimatorFacts):
    """One advantage estimator: its name, its facts (EstimatorFacts) and its functions.

    reward_transform, token_advantages, policy_loss: import paths (`package.module.function`) of its functions,
        with the signatures `slime.algo.estimator_functions` documents; call them through `transform_rewards`,
        `advantages` and `loss`. In a record a spec.py declares (`spec()`), a path may be relative to its package.
    """

    name: str
    reward_transform: str
    token_advantages: str
    policy_loss: str

    def transform_rewards(self, raw: Any, n_samples_per_prompt: int, algo: Any) -> Any:
        """Tensor[N] raw rewards -> Tensor[N] rewards the trainer turns into advantages."""
        return load_function(self.reward_transform)(raw, n_samples_per_prompt, algo)

    def advantages(self, inputs: Any, algo: Any) -> tuple[Any, Any]:
        """AdvantageInputs -> (advantages Tensor[T], returns Tensor[T] or None), before whitening."""
        return load_function(self.token_advantages)(inputs, algo)

    def loss(self, inputs: Any, algo: Any) -> dict[str, Any]:
        """PolicyLossInputs -> {"loss": per-token Tensor[T], optional detached per-token metrics}."""
        return load_function(self.policy_loss)(inputs, algo)

    def function_paths(self) -> tuple[str, str, str]:
        return (self.reward_transform, self.token_advantages, self.policy_loss)

    def facts(self) -> EstimatorFacts:
        return EstimatorFacts(**{f.name: getattr(self, f.name) for f in dataclasses.fields(EstimatorFacts)})

    def spec(self) -> Spec:
        """The record as its registry holds it (what a spec.py declares), with the estimators' checks."""
        return Spec(
            seam=ADVANTAGE_ESTIMATORS.key,
            name=self.name,
            target=dict(zip(ROLES, self.function_paths())),
            facts=self.facts(),
            checks=ESTIMATOR_CHECKS,
        )


def load_function(path: str) -> Callable[..., Any]:
    """The function at import path `package.module.function` (imported on first use)."""
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


class EstimatorRegistry:
    """slime.registry.ADVANTAGE_ESTIMATORS read as `Estimator` records (the key, names, `in` and unknown_message of
    every registry), and an estimator of the caller's registered in-process (`register`: a test's, or a script's
    that trains in its own process; a run's Ray workers find a package's spec.py, named by its import path)."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self.key = registry.key
        self.what = registry.what

    def register(self, record: Estimator) -> None:
        """Add `record`; ValueError when its name is taken (unregister the old one first)."""
        if record.name in self.registry:
            raise ValueError(f"{self.what} {record.name!r} is already registered")
        self.registry.register(record.spec())

    def unregister(self, name: str) -> Estimator:
        """Remove and return the record of `name` (ValueError naming the choices when there is none)."""
        record = self.get(name)
        self.registry.unregister(name)
        return record

    def get(self, name: str) -> Estimator:
        """The record of `name`; ValueError naming the registered ones (and the closest) otherwise."""
        spec = self.registry.spec(name)
        functions = {role: spec.absolute(spec.target[role]) for role in ROLES}
        facts = self.registry.facts(name)
        return Estimator(name=name, **functions, **{f.name: getattr(facts, f.name) for f in dataclasses.fields(facts)})

    def find(self, name: object) -> Optional[Estimator]:
        """The record of `name`, or None: for code that must tolerate a name validation reports (derive)."""
        try:
            return self.get(name) if name in self.registry else None  # type: ignore[arg-type]
        except ValueError:  # a package named by its import path whose spec.py is broken: validation says why
            return None

    def names(self, where: Optional[Callable[[Estimator], bool]] = None) -> list[str]:
        """The registered names, sorted; with `where`, those whose record satisfies it."""
        return [name for name in self.registry.names() if where is None or where(self.get(name))]

    def __contains__(self, name: object) -> bool:
        return name in self.registry

    def unknown_message(self, name: object) -> str:
        return self.registry.unknown_message(name)


ESTIMATORS = EstimatorRegistry(ADVANTAGE_ESTIMATORS)
