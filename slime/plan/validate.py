"""Validation: one walk over the whole config before anything starts, reporting every problem at once.

Each problem names the key, its value, what is wrong and the override that fixes it; `main.py` turns a
`ConfigError` into exit status 2. Each rule lives in one of three tiers (docs/architecture.md#validation):

1. schema rules, what the schema alone decides (slime/config: slime.config.rules.schema_problems);
2. part checks, one part's own rules beside its code: the model option against its family name
   (slime/models/check.py), then the registries' (slime.registry): a backend, engine, weight-sync mode or advantage
   estimator names a record, and each record's checks run, `check` for the chosen record (a model family's too),
   `check_unchosen` for the others (options a part owns that the run sets although it chose another part); then
   the parts' checks no record runs (`part_problems`: rollout, sync, tracking, assets, algo names);
3. plan checks, across parts (`plan_problems`): resources and placement (slime/plan/check_resources.py), and the
   two that live beside the part whose options they refuse: a LoRA adapter's sync against the engine
   (slime/sync/check.py) and images against the backend, engine and estimator (slime/vision/check.py). The
   engines' node spans, read off the plan, follow in slime/plan/resolve.py.

Check modules import no torch, Ray or engine at module level, and the estimator records name their torch
functions by import path, so a bad key fails fast (tests/plan/test_registry_walk.py holds validation torch-free).
"""

from __future__ import annotations

from collections.abc import Iterator

from slime.algo.check import check_names
from slime.assets.check import check_generators, check_paths
from slime.config.derived import Derived
from slime.config.problems import ConfigError, Problem, get
from slime.config.rules import schema_problems
from slime.config.schema import RunConfig
from slime.models.check import check_models
from slime.plan.check_resources import check_cluster, check_host_on_several_nodes, check_model_parallel_split
from slime.plan.derive import derive
from slime.registry import ADVANTAGE_ESTIMATORS, ALL, ENGINES, MODEL_FAMILIES, TRAIN_BACKENDS, WEIGHT_SYNC, Registry
from slime.rollout.check_data import check_data
from slime.rollout.check_hooks import check_agent, check_full_async_hooks, check_hooks
from slime.rollout.check_rewards import check_rewards
from slime.rollout.check_template import check_chat_template
from slime.rollout.data_identity import check_data_unchanged
from slime.sync.check import check_adapter_sync, check_delta, check_verify
from slime.tracking.check import check_sinks
from slime.vision.check import check_vision_run

__all__ = ["ConfigError", "Problem", "collect_problems", "validate"]

# Registries whose unknown names are reported here; rewards and rollout functions are reported by their
# owners (slime/rollout/check_rewards.py, check_hooks.py), which also accept import paths.
CHOSEN_BY_NAME = (TRAIN_BACKENDS, ENGINES, WEIGHT_SYNC, ADVANTAGE_ESTIMATORS)


def check_registered(registry: Registry, value: str) -> Iterator[Problem]:
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
    for registry in (MODEL_FAMILIES, *ALL):
        chosen = get(cfg, registry.key)
        for name in registry.names():
            checks = registry.checks(name)
            check = checks.check if name == chosen else checks.check_unchosen
            if check is not None:
                yield from check(cfg)
    for registry in CHOSEN_BY_NAME:
        yield from outside_check(cfg, registry, get(cfg, registry.key))


def outside_check(cfg: RunConfig, registry: Registry, chosen: str) -> Iterator[Problem]:
    """The check of the record a package outside slime declares, where the config chooses it by its import path."""
    if chosen in registry.names():
        return
    try:
        check = registry.spec(chosen).checks.check
    except ValueError:  # an unknown name, or a package whose spec.py is broken: check_registered says which
        return
    if check is not None:
        yield from check(cfg)


def part_problems(cfg: RunConfig) -> Iterator[Problem]:
    """The parts' own checks that no registry record runs (options of a part every run has, or of all of a seam's)."""
    yield from check_names(cfg)
    yield from check_verify(cfg)
    yield from check_delta(cfg)
    yield from check_sinks(cfg)
    yield from check_rewards(cfg)
    yield from check_hooks(cfg)
    yield from check_agent(cfg)
    yield from check_full_async_hooks(cfg)
    yield from check_generators(cfg)
    yield from check_paths(cfg)
    yield from check_data(cfg)
    yield from check_chat_template(cfg)
    yield from check_data_unchanged(cfg)


def plan_problems(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    """The checks across parts: the run's resources and placement, a LoRA adapter's sync, images."""
    yield from check_cluster(cfg, derived)
    yield from check_model_parallel_split(cfg, derived)
    yield from check_host_on_several_nodes(cfg)
    yield from check_adapter_sync(cfg)
    yield from check_vision_run(cfg)


def problems_of(cfg: RunConfig, derived: Derived) -> list[Problem]:
    return [
        *schema_problems(cfg),
        *check_models(cfg),
        *registry_problems(cfg),
        *part_problems(cfg),
        *plan_problems(cfg, derived),
    ]


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
