"""Rewards: the reward a run uses (rollout.rm_type from slime.registry.REWARD_TYPES, or rollout.custom_rm_path with
its call shape), each eval dataset's reward type, and the reward hub's failure and connection limits."""

from __future__ import annotations

from collections.abc import Iterator

from slime.algo.estimators import ESTIMATORS
from slime.config.hooks import HookError, load_callable
from slime.config.install import install_fix
from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.config.validate_eval import valid_eval_datasets
from slime.registry import REWARD_TYPES
from slime.rollout.rewards import GROUP_RM_SHAPE, SAMPLE_RM_SHAPE


def check_rewards(cfg: RunConfig) -> Iterator[Problem]:
    yield from _check_reward_choice(cfg)
    yield from _check_custom_reward(cfg)
    yield from _check_eval_rewards(cfg)
    yield from _check_reward_imports(cfg)


def _check_reward_choice(cfg: RunConfig) -> Iterator[Problem]:
    """Exactly one of rollout.rm_type (a registered name) and rollout.custom_rm_path."""
    r, estimator = cfg.rollout, ESTIMATORS.find(cfg.algo.advantage_estimator)
    if estimator is not None and not estimator.generates:
        return  # sft trains on the data's responses: no reward (a preset's rm_type stays unused)
    if r.custom_rm_path is None and r.rm_type is None and r.agent.entrypoint is None:  # an agent gives its rewards
        yield Problem(
            "rollout.rm_type",
            None,
            "no reward: neither rollout.rm_type nor rollout.custom_rm_path is set",
            f"set rollout.rm_type=<one of {', '.join(REWARD_TYPES.names())}> or rollout.custom_rm_path=<module.fn>",
            machine=True,  # an input the launch needs, not a mistake: the dry run lists it as still needed
        )
    elif r.custom_rm_path is not None and r.rm_type is not None:
        yield Problem(
            "rollout.rm_type",
            r.rm_type,
            "rollout.custom_rm_path is set too, and it takes precedence",
            "set rollout.rm_type=null or rollout.custom_rm_path=null",
        )
    elif r.rm_type is not None and r.rm_type not in REWARD_TYPES:
        yield Problem(
            "rollout.rm_type",
            r.rm_type,
            REWARD_TYPES.unknown_message(r.rm_type),
            f"set rollout.rm_type=<one of {', '.join(REWARD_TYPES.names())}>",
        )


def _reward_types_used(cfg: RunConfig) -> dict[str, str]:
    """{registered reward type: the key that first chooses it} over the training rollout and the eval datasets."""
    r, estimator = cfg.rollout, ESTIMATORS.find(cfg.algo.advantage_estimator)
    choices = []
    if r.custom_rm_path is None and (estimator is None or estimator.generates):
        choices.append(("rollout.rm_type", r.rm_type))
    if cfg.eval.interval:
        for name, dataset in valid_eval_datasets(cfg).items():
            if dataset.rm_type is not None:
                choices.append((f"eval.datasets.{name}.rm_type", dataset.rm_type))
            elif r.custom_rm_path is None:
                choices.append(("rollout.rm_type", r.rm_type))
    used: dict[str, str] = {}
    for key, rm_type in choices:
        if rm_type is not None and rm_type in REWARD_TYPES:
            used.setdefault(rm_type, key)
    return used


def _check_reward_imports(cfg: RunConfig) -> Iterator[Problem]:
    """Each reward type the run uses imports on this machine: a missing dependency (math-verify for `math`) stops
    the run here, not at the first reward of a rollout or, worse, as an eval's zeros."""
    for rm_type, key in _reward_types_used(cfg).items():
        path = REWARD_TYPES.target(rm_type)
        try:
            load_callable(path, key=key)
        except HookError as exc:
            message = f"reward type {rm_type!r} ({path}) cannot be loaded: {exc.message}"
            fix = install_fix(exc.missing) if exc.missing else "reinstall the project (pip install -e .)"
            yield Problem(key, rm_type, message, fix, machine=exc.missing is not None)


def _check_custom_reward(cfg: RunConfig) -> Iterator[Problem]:
    r = cfg.rollout
    if r.custom_rm_path is not None:
        shape = GROUP_RM_SHAPE if r.group_rm else SAMPLE_RM_SHAPE
        try:
            load_callable(r.custom_rm_path, key="rollout.custom_rm_path", signature=shape)
        except HookError as exc:
            form = "rm(args, samples) -> list" if r.group_rm else "rm(args, sample) -> float | dict"
            yield exc.problem(f"give the import path of `{form}` (def or async def)")
    elif r.group_rm:
        yield Problem(
            "rollout.group_rm", True, "a group reward needs rollout.custom_rm_path", "set rollout.custom_rm_path"
        )
    if not 0 <= r.reward.max_failure_ratio <= 1:
        yield Problem(
            "rollout.reward.max_failure_ratio", r.reward.max_failure_ratio, "must be in [0, 1]", "set it to 0.05"
        )
    for key in ("timeout_s", "max_connections"):
        if getattr(r.reward, key) <= 0:
            yield Problem(f"rollout.reward.{key}", getattr(r.reward, key), "must be > 0", "use the default")


def _check_eval_rewards(cfg: RunConfig) -> Iterator[Problem]:
    """Each eval dataset's reward type (its own, else the rollout's) is registered."""
    if not cfg.eval.interval:
        return
    for name, dataset in valid_eval_datasets(cfg).items():
        key, rm_type = f"eval.datasets.{name}", dataset.rm_type or cfg.rollout.rm_type
        if rm_type is not None and rm_type not in REWARD_TYPES:
            yield Problem(
                f"{key}.rm_type",
                dataset.rm_type,
                REWARD_TYPES.unknown_message(rm_type),
                f"set {key}.rm_type=<one of {', '.join(REWARD_TYPES.names())}>",
            )


def check_remote_rm(cfg: RunConfig) -> Iterator[Problem]:
    """The `remote_rm` reward type asks the HTTP reward model at rollout.rm_url."""
    if not cfg.rollout.rm_url:
        yield Problem("rollout.rm_url", None, "rollout.rm_type=remote_rm needs the reward model's URL", "set it")
