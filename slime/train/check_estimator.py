"""The advantage estimator's checks: the KL estimator, TIS mode and level (names defined once, in slime.algo), and what
the chosen record of slime/algo/estimators.py needs, read from the record and never from its name.

slime/plan/validate.py reports an unknown estimator name (from the registry) and runs `check_estimator`; the
knobs the schema alone decides stay in slime/config/validate_algo.py.
"""

from __future__ import annotations

from collections.abc import Iterator

from slime.algo.estimators import ESTIMATORS, KL_TYPES, TIS_LEVELS, TIS_MODES, Estimator
from slime.config.problems import Problem, one_of
from slime.config.routing_replay import RoutingReplay
from slime.config.schema import RunConfig


def check_estimator(cfg: RunConfig) -> Iterator[Problem]:
    """The algo.* names and what the chosen estimator needs (nothing more for an unknown one)."""
    yield from one_of("algo.kl_loss_type", cfg.algo.kl_loss_type, KL_TYPES)
    yield from one_of("algo.tis_mode", cfg.algo.tis_mode, TIS_MODES)
    yield from one_of("algo.tis_level", cfg.algo.tis_level, TIS_LEVELS)
    estimator = ESTIMATORS.find(cfg.algo.advantage_estimator)
    if estimator is not None:
        yield from _check_advantages(cfg, estimator)
        yield from _check_generation(cfg, estimator)


def _check_advantages(cfg: RunConfig, estimator: Estimator) -> Iterator[Problem]:
    """KL in the reward, whitening, samples per prompt and critic steps against what the estimator does."""
    a = cfg.algo
    if a.kl_coef != 0 and not estimator.reward_kl:
        shaped = ESTIMATORS.names(where=lambda e: e.reward_kl)
        yield Problem(
            "algo.kl_coef",
            a.kl_coef,
            f"KL in the reward shapes {', '.join(shaped)} rewards; {estimator.name} ignores it",
            "set algo.kl_coef=0 and use algo.use_kl_loss=true with algo.kl_loss_coef instead",
        )
    if estimator.needs_whitening and not a.normalize_advantages:
        yield Problem(
            "algo.normalize_advantages",
            False,
            f"{estimator.name} requires advantage whitening",
            "set algo.normalize_advantages=true",
        )
    if cfg.rollout.n_samples_per_prompt < estimator.min_samples_per_prompt:
        yield Problem(
            "rollout.n_samples_per_prompt",
            cfg.rollout.n_samples_per_prompt,
            f"{estimator.name}'s reward baseline needs at least {estimator.min_samples_per_prompt} samples per prompt",
            f"set it to {estimator.min_samples_per_prompt} or more",
        )
    for key, what in (
        ("use_opsm", "OPSM drops samples by the sign of their advantage"),
        ("use_opd", "on-policy distillation shapes the advantages"),
    ):
        if getattr(a, key) and not estimator.uses_advantages:
            yield Problem(f"algo.{key}", True, f"{what}; {estimator.name} has none", f"set algo.{key}=false")
    if a.num_critic_only_steps and not estimator.needs_critic:
        critics = ESTIMATORS.names(where=lambda e: e.needs_critic)
        yield Problem(
            "algo.num_critic_only_steps",
            a.num_critic_only_steps,
            f"only {', '.join(critics)} has a critic",
            "set algo.num_critic_only_steps=0",
        )


def _check_generation(cfg: RunConfig, estimator: Estimator) -> Iterator[Problem]:
    """An estimator that learns from the data's responses (sft) has no engine log-probs and nothing to evaluate."""
    if estimator.generates:
        return
    for key in ("use_tis", "use_rollout_logprobs"):
        if getattr(cfg.algo, key):
            yield Problem(
                f"algo.{key}", True, f"{estimator.name} samples have no engine log-probs", f"set algo.{key}=false"
            )
    if RoutingReplay.named(cfg.algo.routing_replay) is RoutingReplay.ROLLOUT:
        yield Problem(
            "algo.routing_replay",
            cfg.algo.routing_replay,
            f"{estimator.name} samples come from no engine, so they carry no engine routes",
            "set algo.routing_replay=train (the trainer's own routes) or none",
        )
    if cfg.eval.interval:
        yield Problem(
            "eval.interval",
            cfg.eval.interval,
            f"{estimator.name} has nothing to generate or reward at eval time",
            "set eval=none",
        )
