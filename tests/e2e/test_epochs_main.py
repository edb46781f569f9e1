"""main.py over two epochs with over-sampling, aborts and partial rollout: each prompt trained once per epoch;
the progress display shows each rollout's groups.

The epoch semantics of docs/data-and-rewards.md#epochs-and-the-data-source at a CPU test's size (16 prompts, batch
4 of 6 over-sampled groups, 2 epochs -> 8 rollout steps).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from slime.assets.digit_task import write_dataset
from slime.rollout.dumps import epoch_coverage, main
from tests.helpers.compose import ROOT
from tests.helpers.runs import main_argv, two_epochs

pytestmark = pytest.mark.slow


def test_two_epochs_with_over_sampling_train_each_prompt_once_per_epoch(tmp_path, capsys):
    data = write_dataset(tmp_path / "digits.jsonl", num_prompts=20, seed=0)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        main_argv(
            run_dir,
            "logger.progress_every_s=0",  # off a terminal: every rollout's group counts as a line
            *two_epochs(data),
            "rollout.over_sampling_batch_size=6",
            "rollout.partial_rollout=true",
            "rollout.mask_offpolicy_in_partial_rollout=true",
            "rollout.deterministic=false",
            "rollout.hf.max_batch_size=4",
            "debug.save_rollout_data=true",
            progress=True,
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    leftovers = [r["perf/rollout_leftover_groups"] for r in records if "perf/rollout_leftover_groups" in r]
    assert leftovers == [2.0] * 7 + [0.0]  # 2 of 6 groups cut each step; the last step trains the last 4
    assert sum(r["perf/rollout_aborted_samples"] for r in records if "perf/rollout_aborted_samples" in r) > 0
    dumped = [json.loads(line) for path in (run_dir / "rollout_data").iterdir() for line in path.open()]
    assert any("start_rollout_id" in s["metadata"] for s in dumped)  # cut groups were trained in a later step
    assert epoch_coverage(run_dir / "rollout_data") == {0: dict.fromkeys(range(16), 1), 1: dict.fromkeys(range(16), 1)}
    # off a terminal the group counts, fetched from the rollout manager, are records of main.log
    lines = [
        line.partition("[slime.tracking.progress][INFO] - ")[2]
        for line in (run_dir / "main.log").read_text().splitlines()
    ]
    assert "rollout 0: 4/4 groups kept, 6 drawn, 2 cut, 0 filtered" in lines
    assert "rollout 7: 4/4 groups kept, 4 drawn, 0 cut, 0 filtered" in lines  # the last step: the 4 groups left
    assert main([str(run_dir / "rollout_data"), "16"]) == 0
    assert "epoch 1: 16 of 16 prompts trained, repeated [], in the buffer 0, missing 0 []" in capsys.readouterr().out
