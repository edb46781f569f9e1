"""Checks of a `recipe=tiny_agent` run (tests/e2e/test_agent_recipe*.py): it learnt, every turn of every trained
episode was trained on exactly the ids the engine sampled (from the run's dumped samples), and the trainer's
log-probs of those ids equal the engine's."""

from __future__ import annotations

import json
from pathlib import Path

from slime.assets.tokenizer_spec import TOOL_CALL, vocabulary
from tests.helpers.runs import metrics, rewards

NUM_ROLLOUT = 150  # conf/recipe/tiny_agent.yaml
EPISODES_PER_STEP = 128  # its rollout.batch_size x n_samples_per_prompt
# 32 prompts a step: the recipe's sizes for a real vLLM (2 optimizer steps of 128 episodes)
SIZES_OF_32_PROMPTS = ["rollout.batch_size=32", "train.global_batch_size=128"]
EPISODES_OF_32_PROMPTS = 256
TRAIN_LOGPROB_DIFF = "train/train_rollout_logprob_abs_diff"
CALL = [vocabulary().index(TOOL_CALL), vocabulary().index("number")]  # `<tool_call> number`: the tool called


def check_agent_run(run_dir: Path, *, episodes_per_step: int = EPISODES_PER_STEP) -> None:
    curve = rewards(run_dir)
    assert len(curve) == NUM_ROLLOUT and curve[0] <= 0.1 and sum(curve[-3:]) / 3 >= 0.8, curve
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    diffs = [r[TRAIN_LOGPROB_DIFF] for r in records if TRAIN_LOGPROB_DIFF in r]
    assert len(diffs) == 2 * NUM_ROLLOUT and max(diffs) < 1e-5, max(diffs)
    calls = [assert_turns_trained_as_sampled(run_dir, step, episodes_per_step) for step in range(NUM_ROLLOUT)]
    assert calls[0] < 0.05 * episodes_per_step and calls[-1] > 0.8 * episodes_per_step, calls  # it learnt to call


def assert_turns_trained_as_sampled(run_dir: Path, step: int, episodes_per_step: int) -> int:
    """For every sample dumped at `step`: each turn's prompt is the episode's ids before it, its sampled ids sit at
    that offset byte for byte with loss mask 1 (0 where the re-rendering check failed), nothing else is trained, and
    the step's `agent/retokenization_mismatch` counts the failed turns. Returns the episodes that called the tool."""
    samples = [json.loads(line) for line in (run_dir / "rollout_data" / f"{step}.jsonl").read_text().splitlines()]
    assert len(samples) == episodes_per_step
    mismatched = called = 0
    for s in samples:
        agent = s["metadata"]["agent"]
        first = agent["first_prompt_length"]
        assert len(s["tokens"]) - s["response_length"] == first and len(agent["turns"]) == 2
        trained = set()
        for turn in agent["turns"]:
            start, sampled = turn["prompt_length"], turn["sampled"]
            assert s["tokens"][start : start + len(sampled)] == sampled
            span = range(start - first, start - first + len(sampled))
            assert [s["loss_mask"][i] for i in span] == [int(not turn["mismatch"])] * len(sampled)
            trained |= set() if turn["mismatch"] else set(span)
            mismatched += turn["mismatch"]
        assert {i for i, m in enumerate(s["loss_mask"]) if m} == trained
        called += agent["turns"][0]["sampled"] == CALL
    assert metrics(run_dir)[step]["agent/retokenization_mismatch"] == mismatched
    return called
