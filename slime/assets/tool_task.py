"""The tool-use example's prompts (`recipe=tiny_tool_use`): "what is 3 plus 4 ?" -> "7".

Written in slime's JSONL format like the digit task. The policy may write the sum as an expression
followed by "=" and let the calculator of `slime.rollout.tool_use` answer.
"""

from __future__ import annotations

import random
from pathlib import Path

from slime.assets import files


def make_prompt(a: int, b: int) -> dict:
    """One record: a chat message asking for a + b, the label, and the operands as metadata."""
    return {
        "prompt": [{"role": "user", "content": f"what is {a} plus {b} ? reply with the answer ."}],
        "label": str(a + b),
        "metadata": {"a": a, "b": b},
    }


def write_dataset(path: str | Path, *, num_prompts: int, seed: int) -> Path:
    """Write `num_prompts` records with operands 0-9 drawn by `random.Random(seed)`; atomic rename."""
    rng = random.Random(seed)
    return files.write_jsonl(path, (make_prompt(rng.randrange(10), rng.randrange(10)) for _ in range(num_prompts)))
