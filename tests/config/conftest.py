"""Config-test fixtures: a finished earlier run that a hostile config must leave untouched."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def earlier_run(tmp_path) -> Path:
    """A finished run's directory: config, metrics, result and a checkpoint of rollout 0."""
    run = tmp_path / "earlier"
    ckpt = run / "checkpoints"
    (ckpt / "iter_0000000" / "model").mkdir(parents=True)
    (ckpt / "iter_0000000" / "model" / "config.json").write_text('{"model_type": "qwen3"}')
    (ckpt / "latest_checkpointed_iteration.txt").write_text("0")
    (run / "config.yaml").write_text("seed: 1234\n")
    (run / "metrics.jsonl").write_text('{"rollout/raw_reward": 0.5, "rollout_id": 0}\n')
    (run / "result.json").write_text('{"status": "completed"}')
    return run
