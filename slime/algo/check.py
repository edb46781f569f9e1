"""The algorithms' own checks, torch-free: the names slime.algo's functions take (`check_names`, run for every config),
and what the chosen advantage estimator needs, read from its facts and never from its name (`check_estimator`: the
check of every estimator's record, slime/algo/spec.py). Knobs the schema alone decides are slime/config/validate_algo.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from slime.algo.choices import KL_TYPES, TIS_LEVELS, TIS_MODES
from slime.config.problems import Problem, one_of
from slime.config.routing_replay import RoutingReplay
from slime.config.schema import RunConfig
from slime.registry import ADVANTAGE_ESTIMATORS, Checks, EstimatorFacts


def check_names(cfg: RunConfig) -> Iterator[Problem]:
    """The KL estimator, TIS mode and TIS level name functions of slime.algo."""
    yield from one_of("algo.kl_loss_type", cfg.algo.kl_loss_type, KL_TYPES)
    yield from one_of("algo.tis_mode", cfg.algo.tis_mode, TIS_MODES)
    yield from one_of("algo.tis_level", cfg.algo.tis_level, TIS_LEVELS)


def check_estimator(cfg: RunConfig) -> Iterator[Problem]:
    """What the chosen estimator (`algo.advantage_estimator`) needs of the other options."""
    name = cfg.algo.advantage_estimator
    facts = ADVANTAGE_ESTIMATORS.facts(name)
    yield from _check_advantages(cfg, name, facts)
    yield from _check_generation(cfg, name, facts)


ESTIMATOR_CHECKS = Checks(check=check_estimator)  # every estimator record's (slime/algo/spec.py, Estimator.spec)


def _those(where: Callable[[EstimatorFacts], bool]) -> str:
    """The registered estimators whose facts satisfy `where`, comma-separated."""
    return ", ".join(n for n in ADVANTAGE_ESTIMATORS.names() if where(ADVANTAGE_ESTIMATORS.facts(n)))


def _check_advantages(cfg: RunConfig, name: str, estimator: EstimatorFacts) -> Iterator[Problem]:
    """KL in the reward, whitening, samples per prompt and critic steps against what the estimator does."""
    a = cfg.algo
    if a.kl_coef != 0 and not estimator.reward_kl:
        yield Problem(
            "algo.kl_coef",
            a.kl_coef,
            f"KL in the reward shapes {_those(lambda e: e.reward_kl)} rewards; {name} ignores it",
            "set algo.kl_coef=0 and use algo.use_kl_loss=true with algo.kl_loss_coef instead",
        )
    if estimator.needs_whitening and not a.normalize_advantages:
        yield Problem(
            "algo.normalize_advantages",
            False,
            f"{name} requires advantage whitening",
            "set algo.normalize_advantages=true",
        )
    if cfg.rollout.n_samples_per_prompt < estimator.min_samples_per_prompt:
        yield Problem(
            "rollout.n_samples_per_prompt",
            cfg.rollout.n_samples_per_prompt,
            f"{name}'s reward baseline needs at least {estimator.min_samples_per_prompt} samples per prompt",
            f"set it to {estimator.min_samples_per_prompt} or more",
        )
    for key, what in (
        ("use_opsm", "OPSM drops samples by the sign of their advantage"),
        ("use_opd", "on-policy distillation shapes the advantages"),
    ):
        if getattr(a, key) and not estimator.uses_advantages:
            yield Problem(f"algo.{key}", True, f"{what}; {name} has none", f"set algo.{key}=false")
    if a.num_critic_only_steps and not estimator.needs_critic:
        yield Problem(
            "algo.num_critic_only_steps",
            a.num_critic_only_steps,
            f"only {_those(lambda e: e.needs_critic)} has a critic",
            "set algo.num_critic_only_steps=0",
        )


def _check_generation(cfg: RunConfig, name: str, estimator: EstimatorFacts) -> Iterator[Problem]:
    """An estimator that learns from the data's responses (sft) has no engine log-probs and nothing to evaluate."""
    if estimator.generates:
        return
    for key in ("use_tis", "use_rollout_logprobs"):
        if getattr(cfg.algo, key):
            yield Problem(f"algo.{key}", True, f"{name} samples have no engine log-probs", f"set algo.{key}=false")
    if RoutingReplay.named(cfg.algo.routing_replay) is RoutingReplay.ROLLOUT:
        yield Problem(
            "algo.routing_replay",
            cfg.algo.routing_replay,
            f"{name} samples come from no engine, so they carry no engine routes",
            "set algo.routing_replay=train (the trainer's own routes) or none",
        )
    if cfg.eval.interval:
        yield Problem(
            "eval.interval",
            cfg.eval.interval,
            f"{name} has nothing to generate or reward at eval time",
            "set eval=none",
        )
