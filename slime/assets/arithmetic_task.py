"""A real task for a real model (recipe=smollm2_arithmetic): sums, differences and products of small integers as
short word problems, the answer expected in `\\boxed{}` (graded by rm_type=math).

Records are in slime's JSONL format (chat messages plus the label). The train and eval splits are disjoint by
construction: a problem (operation, a, b) belongs to `eval` when a hash of it falls in one tenth of the range,
so a held-out question is never trained on, whatever the sizes and seeds.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from slime.assets import files

INSTRUCTION = "Give the answer as \\boxed{number}."
# One solved turn before the question shows the answer's form, the sum written out before the box. Measured on 48
# eval problems with SmolLM2-135M-Instruct (96 tokens): asked in words only, it boxed 17% of its sampled answers;
# after a turn of a bare "\\boxed{7}" it answered "\\boxed{12}" to nearly everything (8% right greedily, 3% at
# T=1); after this turn, which writes the equation first, 52% right greedily and 26% at T=0.7.
EXAMPLE = [
    {"role": "user", "content": f"Ben has 3 coins and gets 4 more. How many coins does Ben have now? {INSTRUCTION}"},
    {"role": "assistant", "content": "Ben had 3 coins and got 4 more: 3 + 4 = 7. \\boxed{7}"},
]
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emma", "Femi", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena")
THINGS = ("apples", "books", "coins", "marbles", "pencils", "stamps", "stickers", "cards")


def _sum(name: str, things: str, a: int, b: int) -> tuple[str, int]:
    return f"{name} has {a} {things} and gets {b} more. How many {things} does {name} have now?", a + b


def _difference(name: str, things: str, a: int, b: int) -> tuple[str, int]:
    a, b = max(a, b), min(a, b)
    return f"{name} has {a} {things} and gives {b} of them away. How many {things} are left?", a - b


def _product(name: str, things: str, a: int, b: int) -> tuple[str, int]:
    return f"{name} fills {a} boxes with {b} {things} each. How many {things} is that in all?", a * b


OPERATIONS = {"sum": (_sum, 2, 50), "difference": (_difference, 2, 50), "product": (_product, 2, 12)}


def in_eval_split(operation: str, a: int, b: int) -> bool:
    digest = hashlib.sha256(f"{operation}:{a}:{b}".encode()).digest()
    return digest[0] < 26  # about one problem in ten


def make_record(rng: random.Random, split: str) -> dict:
    """One problem of `split` (train or eval), drawn by `rng`."""
    while True:
        operation = rng.choice(sorted(OPERATIONS))
        write, low, high = OPERATIONS[operation]
        a, b = rng.randint(low, high), rng.randint(low, high)
        if in_eval_split(operation, a, b) == (split == "eval"):
            break
    question, answer = write(rng.choice(NAMES), rng.choice(THINGS), a, b)
    return {
        "prompt": [*EXAMPLE, {"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "label": str(answer),
        "metadata": {"operation": operation, "a": a, "b": b},
    }


def write_dataset(path: str | Path, *, split: str, num_prompts: int, seed: int) -> Path:
    """Write `num_prompts` records of `split` ("train" or "eval") drawn by `random.Random(seed)`; atomic rename."""
    if split not in ("train", "eval"):
        raise ValueError(f"split={split!r}: train or eval")
    rng = random.Random(seed)
    return files.write_jsonl(path, (make_record(rng, split) for _ in range(num_prompts)))
