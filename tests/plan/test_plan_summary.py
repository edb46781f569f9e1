"""The plan summary a run prints before it starts (slime/plan/plan_summary.py), and the tracker's one-line notes: at
most 30 lines, the stack named, a CPU run in workers, never GPUs."""

from __future__ import annotations

from pathlib import Path

from slime.driver.launch import _one_line
from slime.plan.plan_summary import MAX_LINES, plan_summary
from slime.plan.resolve import resolve
from tests.helpers.compose import typed_config

GPU_RUN = ["model=qwen3_4b", "data.prompt_data=/nonexistent/train.jsonl", "rollout.rm_type=exact_match"]


def summary_of(overrides: list[str]) -> tuple[dict[str, str], list[str], str]:
    """({row name: value}, the lines, the tracker's notes) of a resolved config's plan."""
    cfg, plan = resolve(typed_config(overrides), defer_absent=True)
    lines = plan_summary(cfg, plan, Path("/runs/r1"))
    rows = {line[2:14].strip(): line[14:] for line in lines[1:]}
    return rows, lines, _one_line(cfg, plan.derived)


def test_the_embedded_runs_plan_in_a_dozen_lines_of_cpu_terms():
    rows, lines, notes = summary_of([])
    assert len(lines) <= MAX_LINES and lines[0] == "Run: grpo on tiny_qwen3 (preset embedded), seed 1234"
    assert rows["trainer"] == "fsdp (PyTorch FSDP2 over a transformers model): 1 worker, dp 1, fp32"
    assert rows["engine"] == "hf (built-in transformers server): 1 engine x 1 worker, behind sglang-router (launched)"
    assert rows["resources"] == "CPU, 1 node: trainer workers 1, engine workers 1 (disaggregated)"
    assert rows["batch"] == "32 prompts x 8 samples = 256 samples a step = 2 optimizer steps x 128; lr 0.001"
    assert rows["length"] == "60 rollout steps = 120 optimizer steps, 15360 samples"
    assert rows["checkpoints"] == "the last step -> /tmp/slime-test-run/checkpoints"
    assert rows["run dir"] == "/runs/r1" and rows["files"].startswith("config.yaml (the whole resolved config)")
    assert "eval" not in rows  # no eval configured: no line
    assert not [line for line in lines if "GPU" in line]
    assert notes.startswith("grpo on tiny_qwen3: trainer 1 worker, engines 1 worker (CPU), ") and "GPU" not in notes


def test_a_gpu_run_with_eval_and_a_resume_in_gpu_terms():
    rows, lines, notes = summary_of(
        [*GPU_RUN, "eval=digit_task", "checkpoint.load=/ckpt/run0", "checkpoint.save_interval=20"]
    )
    assert len(lines) <= MAX_LINES
    assert rows["trainer"] == "megatron (Megatron-core GPTModel): 4 GPUs, dp 4, bf16"
    assert rows["engine"].startswith("sglang (SGLang servers): 4 engines x 1 GPU, behind sglang-router")
    assert rows["resources"] == "8 GPUs of 1 node x 8: trainer GPUs 4, engine GPUs 4 (disaggregated)"
    assert rows["checkpoints"].startswith("every 20 steps and the last -> ")
    assert rows["checkpoints"].endswith("; resumed from /ckpt/run0")
    assert rows["eval"] == "every 5 steps: digit_task"
    assert notes.startswith("grpo on qwen3_4b: trainer 4 GPUs, engines 4 GPUs (CUDA), ")
