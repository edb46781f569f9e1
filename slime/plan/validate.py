"""Validation: one walk over the whole config before anything starts, reporting every problem at once.

Each problem names the key, its value, what is wrong and the override that fixes it; `main.py` turns a
`ConfigError` into exit status 2. The walk:

1. the rules the schema alone decides (slime.config.rules.schema_problems), then the model option against its
   family (slime/models/check.py);
2. the registries (slime.registry): a backend, engine, weight-sync mode or advantage estimator
   (slime/algo/estimators.py) names a record, and each slime.registry record's
   checks run: `check` for the chosen record, `check_unchosen` for the others (options a part owns that the
   run sets although it chose another part);
3. the owners' checks that belong to no single record: what the chosen estimator's record needs
   (slime/train/check_estimator.py), resources (slime/plan/check_resources.py), fault
   tolerance (slime/engine/check.py), the logger's packages (slime/tracking/check.py), rewards, hooks and data
   (slime/rollout/check_*.py), images (slime/vision/check.py), paths and generators (slime/assets/check.py).

Check modules import no torch, Ray or engine at module level, and the estimator records name their torch
functions by import path, so a bad key fails fast (tests/plan/test_registry_walk.py holds validation torch-free).
"""

from __future__ import annotations

from collections.abc import Iterator

from slime.algo.estimators import ESTIMATORS, EstimatorRegistry
from slime.assets.check import check_generators, check_paths
from slime.config.derived import Derived
from slime.config.problems import ConfigError, Problem, get
from slime.config.rules import schema_problems
from slime.config.schema import RunConfig
from slime.config.validate_addresses import check_addresses
from slime.engine.check import check_fault_tolerance
from slime.models.check import check_models
from slime.plan.check_resources import check_cluster, check_host_on_several_nodes, check_model_parallel_split
from slime.plan.derive import derive
from slime.registry import ALL, ENGINES, TRAIN_BACKENDS, WEIGHT_SYNC, Registry
from slime.rollout.check_data import check_data
from slime.rollout.check_hooks import check_agent, check_full_async_hooks, check_hooks
from slime.rollout.check_rewards import check_rewards
from slime.rollout.check_template import check_chat_template
from slime.rollout.data_identity import check_data_unchanged
from slime.sync.check import check_adapter_sync, check_delta, check_verify
from slime.tracking.check import check_sinks
from slime.train.check_estimator import check_estimator
from slime.vision.check import check_vision_run

__all__ = ["ConfigError", "Problem", "collect_problems", "validate"]

# Registries whose unknown names are reported here; rewards and rollout functions are reported by their
# owners (slime/rollout/check_rewards.py, check_hooks.py), which also accept import paths.
CHOSEN_BY_NAME = (TRAIN_BACKENDS, ENGINES, WEIGHT_SYNC, ESTIMATORS)


def check_registered(registry: Registry | EstimatorRegistry, value: str) -> Iterator[Problem]:
    try:
        known = value in registry
    except ValueError as exc:  # a package of the user's named by its import path, whose spec.py is broken
        yield Problem(
            registry.key, value, str(exc), f"fix {value}'s spec.py, or set {registry.key} to a registered name"
        )
        return
    if not known:
        yield Problem(
            registry.key,
            value,
            registry.unknown_message(value),
            f"set {registry.key}=<one of {', '.join(registry.names())}>",
        )


def registry_problems(cfg: RunConfig) -> Iterator[Problem]:
    """Every seam's choice, then the checks its records name (slime.registry.Checks)."""
    for registry in CHOSEN_BY_NAME:
        yield from check_registered(registry, get(cfg, registry.key))
    for registry in ALL:
        chosen = get(cfg, registry.key)
        for name in registry.names():
            checks = registry.checks(name)
            check = checks.check if name == chosen else checks.check_unchosen
            if check is not None:
                yield from check(cfg)


def owner_problems(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    """The checks that belong to no single registry record."""
    yield from check_estimator(cfg)
    yield from check_cluster(cfg, derived)
    yield from check_model_parallel_split(cfg, derived)
    yield from check_fault_tolerance(cfg)
    yield from check_adapter_sync(cfg)
    yield from check_verify(cfg)
    yield from check_delta(cfg)
    yield from check_sinks(cfg)
    yield from check_rewards(cfg)
    yield from check_hooks(cfg)
    yield from check_agent(cfg)
    yield from check_full_async_hooks(cfg)
    yield from check_generators(cfg)
    yield from check_paths(cfg)
    yield from check_addresses(cfg)
    yield from check_host_on_several_nodes(cfg)
    yield from check_data(cfg)
    yield from check_vision_run(cfg)
    yield from check_chat_template(cfg)
    yield from check_data_unchanged(cfg)


def problems_of(cfg: RunConfig, derived: Derived) -> list[Problem]:
    return [*schema_problems(cfg), *check_models(cfg), *registry_problems(cfg), *owner_problems(cfg, derived)]


def collect_problems(cfg: RunConfig) -> list[Problem]:
    """Every problem of `cfg` (an empty list: it is valid)."""
    return problems_of(cfg, derive(cfg))


def validate(cfg: RunConfig) -> Derived:
    """Raise ConfigError listing every problem; return the derived values when there are none."""
    derived = derive(cfg)
    problems = problems_of(cfg, derived)
    if problems:
        raise ConfigError(problems)
    return derived
