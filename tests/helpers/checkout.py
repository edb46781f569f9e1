"""What the tests may not write: anything new in the checkout. Runs, sweeps, trackers and caches default to
places inside it (outputs/, multirun/, wandb/, .cache/); a test points them under its tmp_path instead
(hydra.run.dir=..., paths.root_dir=..., SLIME_CACHE_DIR as tests/conftest.py sets it)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers.compose import ROOT

# Where a run writes by default: checked after every test, so the test that wrote is the one named.
RUN_OUTPUTS = ("outputs", "multirun", "wandb", ".cache")
# What the tools themselves keep in a checkout (interpreter, test runner, linter and packaging caches).
TOOL_CACHES = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".gpu", "build", "dist"}


def run_outputs(depth: int = 2) -> set[str]:
    """Paths (relative to the checkout) of the entries of RUN_OUTPUTS, down to `depth` levels below each
    (outputs/<date>/<time>: a run directory is a new entry at depth 2)."""
    found = set()
    for name in RUN_OUTPUTS:
        found |= _entries(ROOT / name, depth)
    return found


def new_files() -> set[str]:
    """Every path in the checkout but the tools' caches (relative to it)."""
    found = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in TOOL_CACHES and not d.endswith(".egg-info")]
        base = Path(folder).relative_to(ROOT)
        found |= {str(base / name) for name in [*dirs, *files]}
    return found


def _entries(path: Path, depth: int) -> set[str]:
    if not path.is_dir():
        return {str(path.relative_to(ROOT))} if path.exists() else set()
    found = {str(path.relative_to(ROOT))}
    if depth > 0:
        for child in path.iterdir():
            found |= _entries(child, depth - 1)
    return found
