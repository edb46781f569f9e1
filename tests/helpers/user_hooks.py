"""User code that tests/e2e/test_tool_use_recipe.py names by import path in the config (as a user would)."""

from __future__ import annotations

import json

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
