"""The run's objective: one number a sweeper (Hydra's Optuna sweeper, the Ray Jobs launcher) optimises.

`logger.objective` names a logged metric (e.g. `eval/digit_task`, `rollout/raw_reward`, `train/pg_loss`);
its last value is the objective. Unset: the last eval's mean reward (averaged over the eval sets when
there are several), or the last rollout's mean raw reward when the run has no eval.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping
from typing import Optional

from slime.config.problems import Problem
from slime.config.schema import RunConfig

# Metric namespaces the run logs (docs/tracking.md#metrics); an objective outside them can never be found.
OBJECTIVE_NAMESPACES = ("rollout/", "eval/", "train/", "perf/")
DEFAULT_EVAL, DEFAULT_ROLLOUT = "eval mean", "rollout/raw_reward"


def objective_name(cfg: RunConfig) -> str:
    """The metric name (or DEFAULT_EVAL: the eval sets' mean rewards) the objective reads."""
    if cfg.logger.objective is not None:
        return cfg.logger.objective
    return DEFAULT_EVAL if cfg.eval.interval else DEFAULT_ROLLOUT


def check_objective(cfg: RunConfig) -> Iterator[Problem]:
    name = cfg.logger.objective
    if name is None:
        return
    if not name.startswith(OBJECTIVE_NAMESPACES) or name in OBJECTIVE_NAMESPACES:
        yield Problem(
            "logger.objective",
            name,
            f"is not a metric the run logs: metric names start with one of {list(OBJECTIVE_NAMESPACES)}",
            "set logger.objective=rollout/raw_reward (or an eval/<set> metric), or null for the default",
        )
    elif name.startswith("eval/") and not cfg.eval.interval:
        yield Problem(
            "logger.objective",
            name,
            "names an eval metric but the run never evaluates (eval.interval is null)",
            "pick an eval option (eval=digit_task) or set eval.interval, or use a rollout/ or train/ metric",
        )


def objective_value(name: str, last: Mapping[str, float], last_eval: Mapping[str, float]) -> Optional[float]:
    """The objective from the last logged metrics (`last`: rollout + last train step; `last_eval`)."""
    if name == DEFAULT_EVAL:
        # eval/<set> is a set's mean reward; eval/<set>-pass@k and -truncated_ratio derive from it.
        means = [v for k, v in last_eval.items() if k.startswith("eval/") and "-" not in k[len("eval/") :]]
        return statistics.fmean(means) if means else last.get(DEFAULT_ROLLOUT)
    value = last_eval.get(name, last.get(name))
    return None if value is None else float(value)
