"""`python main.py model.lora.rank=8`: the embedded default trained through adapters on a frozen base learns the digit
task; the engine generates with the trainer's merged weights after every sync; the checkpoint holds what trains."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from tests.helpers.compose import typed_config
from tests.helpers.processes import assert_no_run_processes
from tests.helpers.runs import main_py, rewards

pytestmark = pytest.mark.slow


def test_the_embedded_default_learns_through_rank_8_adapters(tmp_path):
    run_dir = tmp_path / "run"
    proc = main_py(run_dir, "model.lora.rank=8")
    assert proc.returncode == 0, proc.stderr[-3000:]
    curve = rewards(run_dir)
    assert len(curve) == 60 and curve[0] <= 0.1 and sum(curve[-3:]) / 3 >= 0.8, curve
    model = typed_config(["model.lora.rank=8"]).model
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/trainable_params" in r]
    # 2 layers x 8 x (128 + 96 + 96 + 128 + 256 + 256 + 256) adapters + the final norm's 64 gains
    assert {r["train/trainable_params"] for r in steps} == {model.lora.parameter_count(model)} == {19_520}
    # the engine generates with exactly the weights the trainer scores with: adapters merged into the base
    diffs = [r["train/train_rollout_logprob_abs_diff"] for r in steps]
    assert len(diffs) == 120 and max(diffs) < 1e-5
    saved = load_file(run_dir / "checkpoints" / "iter_0000059" / "model" / "adapter_model.safetensors")
    assert len(saved) == 2 * 7 * 2 + 1 and "model.norm.weight" in saved
    assert_no_run_processes()
