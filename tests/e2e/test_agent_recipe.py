"""`recipe=tiny_agent` on the built-in engine: plain openai-client agent code (slime/assets/lookup_agent.py) trained
through the gateway on the tiny model learns to call the tool, read its answer and answer; every turn of every
trained episode is trained on exactly the ids the engine sampled (tests/helpers/agent_runs.py)."""

from __future__ import annotations

import pytest

from tests.helpers.agent_runs import check_agent_run
from tests.helpers.metric_history import record
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_py

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1500)
def test_the_agent_learns_to_call_the_tool_and_trains_on_its_own_tokens(tmp_path):
    run_dir = tmp_path / "agent"
    proc = main_py(run_dir, "recipe=tiny_agent", "debug.save_rollout_data=true", timeout=1400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record("tiny_agent_hf", run_dir, proc)
    check_agent_run(run_dir)
    assert_no_run_processes()
