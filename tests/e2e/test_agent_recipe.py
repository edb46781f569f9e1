"""`recipe=tiny_agent` on the built-in engine: plain openai-client agent code (slime/assets/lookup_agent.py) trained
through the gateway on the tiny model learns to call the tool, read its answer and answer; every turn of every
trained episode is trained on exactly the ids the engine sampled (tests/helpers/agent_runs.py)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.agent_runs import (
    EPISODES_OF_32_PROMPTS,
    EPISODES_PER_STEP,
    SIZES_OF_32_PROMPTS,
    TRAIN_LOGPROB_DIFF,
    check_agent_run,
)
from tests.helpers.metric_history import record
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_py, metrics

pytestmark = pytest.mark.slow


@pytest.mark.timeout(1500)
def test_the_agent_learns_to_call_the_tool_and_trains_on_its_own_tokens(tmp_path):
    run_dir = tmp_path / "agent"
    proc = main_py(run_dir, "recipe=tiny_agent", "debug.save_rollout_data=true", timeout=1400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record("tiny_agent_hf", run_dir, proc)
    check_agent_run(run_dir)
    assert_no_run_processes()


def test_an_agent_that_raises_in_a_tenth_of_its_episodes_fails_those_samples_and_the_run_goes_on(tmp_path):
    """tests.helpers.agents.raises_in_one_of_ten raises after its turn for the secret 0 (a tenth of the lookup
    task's records; 32 prompts a step, so that each step draws some): those samples fail (reward 0, no loss), the
    step reports them, and under rollout.reward.max_failure_ratio=0.3 the run completes."""
    run_dir = tmp_path / "raising"
    overrides = ["rollout.agent.entrypoint=tests.helpers.agents:raises_in_one_of_ten", "train.num_rollout=2"]
    overrides += SIZES_OF_32_PROMPTS
    proc = main_py(run_dir, "recipe=tiny_agent", *overrides, "rollout.reward.max_failure_ratio=0.3", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = metrics(run_dir)
    assert len(steps) == 2
    for step in steps.values():
        assert 0 < step["agent/failed_episodes"] == step["rollout/reward_failed"] < 0.3 * EPISODES_OF_32_PROMPTS
    assert json.loads((run_dir / "result.json").read_text())["status"] == "completed"
    assert_no_run_processes()


def test_with_samples_turns_each_turn_trains_as_a_sample_of_its_own(tmp_path):
    """rollout.agent.samples=turns: each optimizer step of 64 two-turn episodes trains 128 turn samples, and the
    trainer's log-probs of each turn's sampled ids, in the context the turn's sample gives them, equal the engine's."""
    run_dir = tmp_path / "turns"
    proc = main_py(run_dir, "recipe=tiny_agent", "rollout.agent.samples=turns", "train.num_rollout=3", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/global_batch_size" in r]
    assert [r["train/global_batch_size"] for r in steps] == [2.0 * EPISODES_PER_STEP / 2] * 6
    assert max(r[TRAIN_LOGPROB_DIFF] for r in steps) < 1e-5
    assert_no_run_processes()
