"""The agent example's task (`recipe=tiny_agent`): "what is the number ?", where the number is a secret digit of
each record that only the `number` tool tells. An episode (slime.assets.lookup_agent) is two turns: the model calls
the tool, reads its answer, then answers.

Written in slime's JSONL format like the digit task; the secret is the label and in the metadata.
"""

from __future__ import annotations

import random
from pathlib import Path

from slime.assets import files

QUESTION = "what is the number ?"


def make_prompt(secret: int) -> dict:
    """One record: the question as a chat message, the secret digit as label and metadata."""
    return {"prompt": [{"role": "user", "content": QUESTION}], "label": str(secret), "metadata": {"secret": secret}}


def write_dataset(path: str | Path, *, num_prompts: int, seed: int) -> Path:
    """Write `num_prompts` records with secrets 0-9 drawn by `random.Random(seed)`; atomic rename."""
    rng = random.Random(seed)
    return files.write_jsonl(path, (make_prompt(rng.randrange(10)) for _ in range(num_prompts)))
