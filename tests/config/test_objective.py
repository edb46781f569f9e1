"""logger.objective: which number a run hands a sweeper, and its validation."""

from __future__ import annotations

import pytest

from slime.config.objective import DEFAULT_EVAL, objective_name, objective_value
from slime.plan.validate import collect_problems
from tests.helpers.compose import typed_config

LAST = {"rollout/raw_reward": 0.25, "train/pg_loss": -0.5}
EVAL = {"eval/a": 0.5, "eval/a-pass@1": 0.5, "eval/a-truncated_ratio": 0.0, "eval/b": 1.0}


def test_default_is_the_eval_mean_with_eval_else_the_raw_reward():
    assert objective_name(typed_config([])) == "rollout/raw_reward"
    assert objective_name(typed_config(["eval=digit_task"])) == DEFAULT_EVAL
    assert objective_value(DEFAULT_EVAL, LAST, EVAL) == pytest.approx(0.75)  # mean over sets a and b
    assert objective_value(DEFAULT_EVAL, LAST, {}) == 0.25  # no eval has run yet
    assert objective_value("rollout/raw_reward", LAST, EVAL) == 0.25


def test_a_named_metric_is_its_last_value():
    assert objective_name(typed_config(["logger.objective=train/pg_loss"])) == "train/pg_loss"
    assert objective_value("train/pg_loss", LAST, EVAL) == -0.5
    assert objective_value("eval/a-pass@1", LAST, EVAL) == 0.5
    assert objective_value("train/kl_loss", LAST, EVAL) is None


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["logger.objective=reward"], "metric names start with one of"),
        (["logger.objective=eval/digit_task"], "never evaluates"),
    ],
)
def test_an_objective_the_run_cannot_log_is_a_config_error(overrides, fragment):
    problems = [p for p in collect_problems(typed_config(overrides)) if p.key == "logger.objective"]
    assert len(problems) == 1 and fragment in str(problems[0])


def test_an_eval_objective_with_eval_is_valid():
    cfg = typed_config(["eval=digit_task", "logger.objective=eval/digit_task-pass@1"])
    assert not [p for p in collect_problems(cfg) if p.key == "logger.objective"]
