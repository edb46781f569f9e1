"""The embedded default's synthetic task: "What comes after 7?" -> "8" (digits wrap: 9 -> 0).

Prompts are written in slime's JSONL format (a list of chat messages plus a label), so the same
data path, chat templating and reward plumbing serve real datasets. The answer depends on the prompt:
a constant answer scores 0.1 at best.
"""

from __future__ import annotations

import random
from pathlib import Path

from slime.assets import files


def make_prompt(digit: int) -> dict:
    """One record: chat messages with `step_loss_mask`, the label, and metadata."""
    return {
        "prompt": [{"role": "user", "content": f"What comes after {digit}?", "step_loss_mask": 1}],
        "label": str((digit + 1) % 10),
        "metadata": {"digit": digit},
    }


def write_dataset(path: str | Path, *, num_prompts: int, seed: int) -> Path:
    """Write `num_prompts` records with digits drawn by `random.Random(seed)`; atomic rename."""
    rng = random.Random(seed)
    return files.write_jsonl(path, (make_prompt(rng.randrange(10)) for _ in range(num_prompts)))
