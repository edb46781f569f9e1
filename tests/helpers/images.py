"""Image prompts for the vision tests: records of the shape task written as files, and image files of each kind."""

from __future__ import annotations

import json
import random
from pathlib import Path

from slime.assets.shape_task import draw, make_prompt


def shape_records(count: int, seed: int = 0) -> list[dict]:
    """`count` records of the shape task (their images embedded as PNG data URLs)."""
    rng = random.Random(seed)
    return [make_prompt(rng) for _ in range(count)]


def write_records(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def png_file(path: Path, cells: list[str | None]) -> Path:
    """A shape-task image saved as a PNG file at `path`."""
    draw(cells).save(path, format="PNG")
    return path
