"""`recipe=tiny_vlm`: a vision-language model learns to count red squares from pixels on CPU (the answer is in the
image only; the best constant answer scores 0.375), the trainer's log-probs of image prompts within 1e-5 of the
built-in engine's in fp32, every sample's images in its record."""

from __future__ import annotations

import json

import pytest

from tests.helpers.metric_history import record
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_py, metrics

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_the_tiny_vision_model_learns_to_count_from_pixels(tmp_path):
    run_dir = tmp_path / "vlm"
    proc = main_py(run_dir, "recipe=tiny_vlm", timeout=800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = record("tiny_vlm", run_dir, proc)
    steps = metrics(run_dir)
    assert len(steps) == 100
    first = steps[min(steps)]["rollout/raw_reward"]
    assert first < 0.2, first  # the random policy
    assert figures["last3_reward"] >= 0.8, figures
    assert figures["max_logprob_diff"] < 1e-5, figures
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["images"][0].startswith("data:image/png;base64,") for s in samples)
    assert all(s["tokens"].count(82) >= 4 for s in samples)  # each prompt's image: 4 image tokens
    assert_no_run_processes()


def test_image_prompts_through_sglangs_request_types_and_weight_updater(tmp_path):
    """rollout=sglang with the fake SGLang server (SGLang 0.5.23's own request types and weight updater around the
    built-in engine): every image request passes SGLang's GenerateReqInput, and after each push the trainer's
    log-probs stay within 1e-5 of the engine's (the tower trains: a push without it would leave them apart)."""
    run_dir = tmp_path / "vlm_sglang"
    overrides = ["rollout=sglang", "rollout.sglang_launch.module=tests.fakes.fake_sglang", "train.num_rollout=3"]
    proc = main_py(run_dir, "recipe=tiny_vlm", *overrides, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    diffs = [r["train/train_rollout_logprob_abs_diff"] for r in records if "train/train_rollout_logprob_abs_diff" in r]
    assert len(diffs) == 6 and max(diffs) < 1e-5, diffs
    assert len(metrics(run_dir)) == 3
    assert_no_run_processes()
