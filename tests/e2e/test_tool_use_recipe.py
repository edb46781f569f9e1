"""recipe=tiny_tool_use end to end, with a custom rollout function and filter given by import path (the calculator
tool on its own: tests/rollout/test_tool_use.py)."""

from __future__ import annotations

import json

import pytest

from slime.assets.tokenizer import build_tokenizer
from tests.helpers.compose import ROOT
from tests.helpers.runs import main_py


@pytest.mark.slow
def test_tiny_tool_use_recipe_masks_every_tool_token(tmp_path, monkeypatch):
    dump = tmp_path / "samples.jsonl"
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    proc = main_py(
        tmp_path / "run",
        "recipe=tiny_tool_use",
        "train.num_rollout=3",
        f"rollout.function={{_target_:tests.helpers.user_hooks.dumping_rollout,dump:'{dump}'}}",
        "algo.dynamic_filter=tests.helpers.user_hooks.marking_filter",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["user/dumped_samples"] for r in records if "user/dumped_samples" in r] == [32.0] * 3
    samples = [json.loads(line) for line in dump.read_text().splitlines()]
    assert len(samples) == 96 and all(s["metadata"]["kept_by"] == "marking_filter" for s in samples)
    tokenizer, calls = build_tokenizer(), 0
    for s in samples:
        spans = s["metadata"].get("tool_spans", [])
        tool = {i for start, end in spans for i in range(start, end)}
        assert len(s["loss_mask"]) == len(s["rollout_log_probs"]) == s["response_length"] <= 24
        assert all(s["loss_mask"][i] == (0 if i in tool else 1) for i in range(s["response_length"]))
        assert all(s["rollout_log_probs"][i] == 0.0 for i in tool)
        response_ids = s["tokens"][len(s["tokens"]) - s["response_length"] :]
        for (start, end), (_, result) in zip(spans, s["metadata"].get("tool_calls", []), strict=True):
            assert 0 < end - start == min(len(result), 24 - start)  # one token per character of the result
            assert tokenizer.decode(response_ids[start:end]).replace(" ", "") == result[: end - start]
        calls += len(spans)
    assert calls >= 5, "the policy hardly called the tool: nothing was checked"
