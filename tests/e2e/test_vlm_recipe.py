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
