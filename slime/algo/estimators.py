"""The algorithm registry: one record per advantage estimator (`algo.advantage_estimator`), and the names of the
KL estimators (`algo.kl_loss_type`), TIS modes (`algo.tis_mode`) and TIS levels (`algo.tis_level`).

A record says everything that differs between estimators: how the rollout side transforms the per-sample
rewards, how the trainer turns them into per-token advantages, the policy-gradient loss (import paths of the
functions, `slime.algo.estimator_functions` for the built-in ones), and what the estimator needs (a critic, a
forward pass for ℓ_old, whitening, several samples per prompt, generated responses). Code that depends on the
estimator reads the record (`ESTIMATORS.get(name)`) and never compares its name. Adding an estimator is one
`Estimator(...)` plus its functions, registered with `ESTIMATORS.register`.

Like the other registries (slime/registry.py) the functions are import paths resolved on first use, so this
module imports only the standard library: validation, the dry run and the driver read the records without
importing torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Iterable
from typing import Any

KL_TYPES: tuple[str, ...] = ("k1", "k2", "k3", "low_var_kl")  # slime.algo.kl.approx_kl
TIS_MODES: tuple[str, ...] = ("truncate", "icepop")  # slime.algo.off_policy.tis_weights
TIS_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")  # slime.algo.off_policy.tis_log_ratio

FUNCTIONS = "slime.algo.estimator_functions"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Estimator:
    """One advantage estimator.

    reward_transform, token_advantages, policy_loss: import paths (`package.module.function`) of its functions,
        with the signatures `slime.algo.estimator_functions` documents; call them through `transform_rewards`,
        `advantages` and `loss`.
    needs_critic: a value model is trained alongside (its values feed the token advantages).
    needs_old_log_probs: the loss reads ℓ_old beyond stopgrad(ℓ), so a forward-only pass computes it even
        with one optimizer step per rollout.
    reward_kl: KL goes in the reward (algo.kl_coef shapes the advantages); the others take KL only as a
        loss term (algo.use_kl_loss).
    needs_whitening: advantages are meaningful only whitened (algo.normalize_advantages must be true).
    uses_advantages: the policy loss reads advantages (whitening them is skipped otherwise).
    generates: the policy generates the responses it learns from; False (SFT) reads them from the data,
        so there are no engine log-probs, no reward and nothing to evaluate.
    min_samples_per_prompt: the smallest rollout.n_samples_per_prompt the reward transform accepts.
    rollout_function: the `rollout.function` registry name used when rollout.function is null.
    """

    name: str
    reward_transform: str
    token_advantages: str
    policy_loss: str
    needs_critic: bool = False
    needs_old_log_probs: bool = False
    reward_kl: bool = False
    needs_whitening: bool = False
    uses_advantages: bool = True
    generates: bool = True
    min_samples_per_prompt: int = 1
    rollout_function: str = "default"

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


def load_function(path: str) -> Callable[..., Any]:
    """The function at import path `package.module.function` (imported on first use)."""
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


class EstimatorRegistry:
    """Estimator records by name, for the config key `algo.advantage_estimator`.

    Same reading surface as `slime.registry.Registry` (key, names, `in`, unknown_message), so validation and
    `--help` list these names like every other seam's.
    """

    key = "algo.advantage_estimator"
    what = "advantage estimator"

    def __init__(self, records: Iterable[Estimator]):
        self._records: dict[str, Estimator] = {}
        for record in records:
            self.register(record)

    def register(self, record: Estimator) -> None:
        """Add `record`; ValueError when its name is taken (unregister the old one first)."""
        if record.name in self._records:
            raise ValueError(f"{self.what} {record.name!r} is already registered")
        self._records[record.name] = record

    def unregister(self, name: str) -> Estimator:
        """Remove and return the record of `name` (ValueError naming the choices when there is none)."""
        record = self.get(name)
        del self._records[name]
        return record

    def get(self, name: str) -> Estimator:
        """The record of `name`; ValueError naming the registered ones (and the closest) otherwise."""
        record = self.find(name)
        if record is None:
            raise ValueError(self.unknown_message(name))
        return record

    def find(self, name: object) -> Estimator | None:
        """The record of `name`, or None: for code that must tolerate a name validation reports (derive)."""
        return self._records.get(name)  # type: ignore[arg-type]

    def names(self, where: Callable[[Estimator], bool] | None = None) -> list[str]:
        """The registered names, sorted; with `where`, those whose record satisfies it."""
        return sorted(name for name, record in self._records.items() if where is None or where(record))

    def __contains__(self, name: object) -> bool:
        return name in self._records

    def unknown_message(self, name: object) -> str:
        close = difflib.get_close_matches(str(name), self.names(), n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        return f"unknown {self.what} {name!r}{hint}; registered: {', '.join(self.names())}"


GRPO = Estimator(
    name="grpo",
    reward_transform=f"{FUNCTIONS}.group_normalized_rewards",
    token_advantages=f"{FUNCTIONS}.broadcast_advantages",
    policy_loss=f"{FUNCTIONS}.clipped_surrogate_loss",
)
GSPO = Estimator(
    name="gspo",
    reward_transform=f"{FUNCTIONS}.group_normalized_rewards",
    token_advantages=f"{FUNCTIONS}.broadcast_advantages",
    policy_loss=f"{FUNCTIONS}.sequence_clipped_surrogate_loss",
    needs_old_log_probs=True,
)
CISPO = Estimator(
    name="cispo",
    reward_transform=f"{FUNCTIONS}.group_normalized_rewards",
    token_advantages=f"{FUNCTIONS}.broadcast_advantages",
    policy_loss=f"{FUNCTIONS}.clipped_weight_loss",
)
RLOO = Estimator(
    name="rloo",
    reward_transform=f"{FUNCTIONS}.leave_one_out_rewards",
    token_advantages=f"{FUNCTIONS}.broadcast_advantages",
    policy_loss=f"{FUNCTIONS}.clipped_surrogate_loss",
    min_samples_per_prompt=2,
)
REINFORCE_PLUS_PLUS = Estimator(
    name="reinforce_plus_plus",
    reward_transform=f"{FUNCTIONS}.raw_rewards",
    token_advantages=f"{FUNCTIONS}.reinforce_plus_plus_advantages",
    policy_loss=f"{FUNCTIONS}.clipped_surrogate_loss",
    reward_kl=True,
    needs_whitening=True,
)
REINFORCE_PLUS_PLUS_BASELINE = Estimator(
    name="reinforce_plus_plus_baseline",
    reward_transform=f"{FUNCTIONS}.group_centred_rewards",
    token_advantages=f"{FUNCTIONS}.centred_minus_kl_advantages",
    policy_loss=f"{FUNCTIONS}.clipped_surrogate_loss",
    reward_kl=True,
    needs_whitening=True,
)
PPO = Estimator(
    name="ppo",
    reward_transform=f"{FUNCTIONS}.raw_rewards",
    token_advantages=f"{FUNCTIONS}.gae_advantages",
    policy_loss=f"{FUNCTIONS}.clipped_surrogate_loss",
    needs_critic=True,
    needs_old_log_probs=True,
    reward_kl=True,
)
SFT = Estimator(
    name="sft",
    reward_transform=f"{FUNCTIONS}.raw_rewards",
    token_advantages=f"{FUNCTIONS}.no_advantages",
    policy_loss=f"{FUNCTIONS}.negative_log_likelihood_loss",
    uses_advantages=False,
    generates=False,
    rollout_function="sft",
)

ESTIMATORS = EstimatorRegistry((GRPO, GSPO, CISPO, RLOO, REINFORCE_PLUS_PLUS, REINFORCE_PLUS_PLUS_BASELINE, PPO, SFT))
