"""debug=rollout_only (no trainer) and debug=train_only (no engines, trains from rollout dumps).

Their validation here; the workflow docs/troubleshooting.md#debug-modes gives (a rollout_only run dumps its samples,
a train_only run trains from them) runs end to end in tests/e2e/test_debug_mode_runs.py."""

from __future__ import annotations

import pytest

from tests.helpers.runs import main_py
from tests.helpers.validation import problems_for


@pytest.mark.parametrize(
    "overrides,key,text",
    [
        (["debug=train_only"], "debug.load_rollout_data", "debug=train_only starts no engines"),
        (["debug=rollout_only", "debug.load_rollout_data={tmp}"], "debug.rollout_only", "conflicts with"),
        (["debug=rollout_only", "debug.train_only=true"], "debug.rollout_only", "conflicts with debug.train_only"),
        (["debug=rollout_only", "cluster.colocate=true"], "cluster.colocate", "no trainer to share"),
        (["debug=rollout_only", "checkpoint.load={tmp}"], "checkpoint.load", "no trainer to load it into"),
    ],
    ids=["train_only_without_dumps", "rollout_only_with_dumps", "both", "rollout_only_colocated", "rollout_only_load"],
)
def test_debug_mode_problems_name_the_key(overrides, key, text, tmp_path):
    overrides = [o.format(tmp=tmp_path) for o in overrides]
    found = problems_for(overrides, tmp_path / "run")
    assert key in found and text in found[key], found


def test_cli_train_only_without_dumps_exits_2(tmp_path):
    proc = main_py(tmp_path / "run", "debug=train_only")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "debug.load_rollout_data" in proc.stderr and "debug.save_rollout_data=true" in proc.stderr
    assert not (tmp_path / "run" / "config.yaml").exists()
