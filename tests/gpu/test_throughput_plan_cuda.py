"""GPU tier: on the bench's Qwen3-1.7B shape, what a run logs and plans agrees with what the GPU measures.

`tools/bench_train.py` times one GRPO step of each backend on its RL-shaped batch and reports, beside its own MFU
(the LM head on every token, the whole step), the `perf/mfu` that the backend's step logs in a run (the LM head on
response tokens, the train phase alone), and the dry run's memory estimate for the same config sized by the batch's
largest micro-batch against the measured peak. One variant of each backend with and without recompute, and a LoRA
step with layer checkpointing (its peak is mostly what the plan counts beside the training state: FSDP2's gathered
parameters, activations, logits).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.compose import ROOT

pytestmark = pytest.mark.gpu

VARIANTS = ["fsdp_32k_ckpt_compile", "megatron_32k_compile"]
MEMORY_ONLY = ["fsdp_16k_ckpt_lora"]  # its MFU counts the frozen weights' matmuls twice; the plan is what is checked


def test_the_runs_mfu_and_the_memory_plan_agree_with_the_bench(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "bench_train.py"),
        "--steps",
        "2",
        "--timeout",
        "240",
        "--json",
        str(out),
    ]
    subprocess.run([*cmd, "--variants", *VARIANTS, *MEMORY_ONLY], check=True, timeout=600)
    bench = json.loads(out.read_text())
    for row in bench["rows"]:
        assert "error" not in row, row
        print(f"{row['variant']}: plan {row['plan_gib']:.1f} GiB, peak {row['peak_gib']:.1f} GiB")
        assert row["plan_gib"] == pytest.approx(row["peak_gib"], rel=0.15), row["variant"]
        if row["variant"] in VARIANTS:
            bench_mfu = row["tflops"] / bench["ceiling_tflops"]
            assert row["run_mfu"] == pytest.approx(bench_mfu, rel=0.05), row["variant"]
