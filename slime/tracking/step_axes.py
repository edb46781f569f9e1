"""Step axes (docs/tracking.md#step-axes): the counter each metric family is plotted against, and wandb's own step.

Shared by the wandb run and the TensorBoard sink; pure Python.
"""

from __future__ import annotations

from typing import Any

# Step axes: each metric family is plotted against its own counter.
STEP_AXES = {
    "train/*": "train/step",
    "rollout/*": "rollout/step",
    "perf/*": "rollout/step",
    "multi_turn/*": "rollout/step",
    "passrate/*": "rollout/step",
    "eval/*": "eval/step",
}


def axis_of(key: str) -> str:
    """The step axis a metric is plotted against (rollout/step for families not listed)."""
    return STEP_AXES.get(key.split("/", 1)[0] + "/*", "rollout/step")


def optimizer_step(record: dict[str, Any], steps_per_rollout: int) -> int:
    """wandb's step for a record: train/step itself; a rollout's record: its last optimizer step; eval after
    rollout e - 1 (eval/step = e): e·K - 1. Monotonic in the order the driver logs, and the same on a resume."""
    k = max(steps_per_rollout, 1)
    if "train/step" in record:
        return int(record["train/step"])
    if "rollout/step" in record:
        return int(record["rollout/step"]) * k + k - 1
    return max(int(record.get("eval/step", 0)) * k - 1, 0)
