"""User code that end-to-end runs name by import path in the config (as a user would): tests/e2e/test_tool_use_recipe.py's
rollout and filter, tests/e2e/test_end_to_end.py's data source that fails at startup and reward whose judge is missing."""

from __future__ import annotations

import json

from slime.rollout.data_source import DataSource
from slime.rollout.default import generate_rollout


def dumping_rollout(args, rollout_id, data_source, evaluation=False, *, dump: str):
    """A custom rollout function (a `_target_` node binds `dump`): the default one, plus a JSONL dump of the
    samples it returns and a metric of its own."""
    out = generate_rollout(args, rollout_id, data_source, evaluation)
    with open(dump, "a") as f:
        for sample in (s for g in out.groups for s in g):
            f.write(json.dumps(dict(sample.to_dict(), rollout_step=rollout_id)) + "\n")
    out.metrics["user/dumped_samples"] = float(sum(len(g) for g in out.groups))
    return out


def marking_filter(args, group):
    """A custom dynamic filter: keeps every group and marks its samples."""
    for sample in group:
        sample.metadata["kept_by"] = "marking_filter"
    return True


class DataSourceFailingAtStartup(DataSource):
    """Valid by every check (importable, a DataSourceBase, the documented constructor); its constructor raises,
    as user code with a bug does, once the rollout manager builds it at startup."""

    def __init__(self, dataset, **kwargs):
        raise RuntimeError("this data source fails at startup on purpose")


def reward_whose_judge_is_missing(args, sample):
    """A custom reward that imports its judge when called (so validation cannot see it is missing): every call
    fails, as a reward's does on a machine without its dependency."""
    raise ModuleNotFoundError("No module named 'judge_of_this_test'", name="judge_of_this_test")
