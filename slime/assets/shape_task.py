"""The tiny vision model's synthetic task: "how many red squares ?" over a 56 x 56 image -> "2".

Each image is a 2 x 2 grid of 28-pixel cells (one image token each, after the tower folds 2 x 2 patches of 14
pixels); a cell holds a red square (probability 1/2), a green one (1/4) or nothing. The answer, 0 to 4, can only be
read from the image: the best constant answer ("2") scores 0.375. Images are embedded in the records as PNG data
URLs (`images`, the key `data.multimodal_keys` maps), so the file is self-contained.
"""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw

from slime.assets import files
from slime.vision.images import encode_png

CELL, GRID = 28, 2
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 60)}
QUESTION = "how many red squares ?"


def draw(cells: list[str | None]) -> Image.Image:
    """The image of `cells` (row-major, GRID² entries: a colour name or None for an empty cell)."""
    image = Image.new("RGB", (CELL * GRID, CELL * GRID), (0, 0, 0))
    pen = ImageDraw.Draw(image)
    for i, colour in enumerate(cells):
        if colour is not None:
            x, y = (i % GRID) * CELL, (i // GRID) * CELL
            pen.rectangle([x + 2, y + 2, x + CELL - 3, y + CELL - 3], fill=COLOURS[colour])
    return image


def make_prompt(rng: random.Random) -> dict:
    """One record: the question, its image, the count of red squares as the label."""
    cells = [rng.choices(["red", "green", None], weights=[2, 1, 1])[0] for _ in range(GRID * GRID)]
    return {
        "prompt": QUESTION,
        "images": [encode_png(draw(cells))],
        "label": str(cells.count("red")),
        "metadata": {"cells": cells},
    }


def write_dataset(path: str | Path, *, num_prompts: int, seed: int) -> Path:
    """Write `num_prompts` records drawn by `random.Random(seed)`; atomic rename."""
    rng = random.Random(seed)
    return files.write_jsonl(path, (make_prompt(rng) for _ in range(num_prompts)))
