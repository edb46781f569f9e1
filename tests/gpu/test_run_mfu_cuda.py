"""GPU tier: `python main.py ... cluster=one_gpu` on the bench's Qwen3-1.7B shape logs `perf/mfu` every step, and the
last step's agrees with `tools/bench_train.py`'s MFU for the same batch (the run's dump of that step), measured
right after on the same GPU, within 5% (two H200s of one kind differed by 8% on one batch).

Each backend once, with the bench variant's settings (no recompute, no compiled layers, 16k tokens per micro-batch):
7 digit-task prompts x 2 samples of 512 generated tokens from random weights (no end token comes), one optimizer step
a rollout, the built-in engine colocated on the same GPU. The first step is not compared (the GPU's first kernels).
Layers are not compiled because compiling costs ~110 s in the run and again in the bench: with it, the fsdp case did
not end within one 10-minute device call (the run ~6 min). Needs Ray and sglang-router on the GPU machine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("GPU tier: a main.py run on a CUDA device (docs/testing.md#the-gpu-tier)", allow_module_level=True)

from tests.helpers.bench_shapes import write_bench_model  # noqa: E402
from tests.helpers.compose import ROOT  # noqa: E402
from tests.helpers.runs import main_py  # noqa: E402

RUN = [
    "model=qwen3_1_7b",
    "preset=embedded",  # the digit task and the built-in engine; the GPU and the sizes below
    "cluster=one_gpu",
    "rollout.deterministic=false",  # batched decoding
    "rollout.batch_size=7",
    "rollout.n_samples_per_prompt=2",
    "rollout.max_response_len=512",
    "train.global_batch_size=14",
    "train.num_steps_per_rollout=1",
    "train.num_rollout=2",
    "train.lr=1e-6",
    "debug.save_rollout_data=true",
    "checkpoint.no_save_optim=true",  # the end-of-run save: the weights alone
]
# the bench variant's settings (tools/bench_train.py VARIANTS) on top of the run's
BACKENDS = {
    "fsdp_16k_eager": [
        "parallelism=fsdp",
        "parallelism.gradient_checkpointing=false",
        "parallelism.max_tokens_per_gpu=16384",
        "parallelism.fsdp.compile=false",
    ],
    "megatron": [
        "parallelism=megatron",
        "parallelism.recompute.granularity=null",
        "parallelism.max_tokens_per_gpu=16384",
    ],
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return write_bench_model(tmp_path_factory.mktemp("qwen3_1p7b_random"))


@pytest.mark.timeout(900)  # the run (up to 500 s) and the bench (up to 400 s)
@pytest.mark.parametrize("variant", BACKENDS)
def test_a_runs_logged_mfu_is_the_benchs_for_its_batch(variant, model_dir, tmp_path):
    run_dir = tmp_path / "run"
    proc = main_py(run_dir, *RUN, f"model.hf_checkpoint={model_dir}", *BACKENDS[variant], timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = {r["rollout/step"]: r for r in records if "perf/mfu" in r}
    assert sorted(steps) == [0, 1]
    out = tmp_path / "bench.json"
    bench = [sys.executable, str(ROOT / "tools" / "bench_train.py"), "--variants", variant, "--steps", "2"]
    bench += ["--batch-from", str(run_dir / "rollout_data" / "1.jsonl"), "--json", str(out), "--timeout", "240"]
    subprocess.run(bench, check=True, timeout=400)
    table = json.loads(out.read_text())
    (row,) = table["rows"]
    assert "error" not in row, row
    bench_mfu = row["tflops"] / table["ceiling_tflops"]
    logged = steps[1]["perf/mfu"]
    summary = proc.stdout[proc.stdout.find("Run completed") :]
    print(f"\n{variant}: run perf/mfu {logged:.4f} per step {[round(s['perf/mfu'], 4) for s in steps.values()]}, ")
    print(f"bench on step 1's batch ({row['tokens']} tokens) {bench_mfu:.4f}, ratio {logged / bench_mfu:.3f}")
    print(summary)
    assert logged == pytest.approx(bench_mfu, rel=0.05)
