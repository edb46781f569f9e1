"""What validation says about a composed config, by key; a snapshot of a directory's files, to show a refused
config damaged nothing earlier (the hostile-input tests, tests/README.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from slime.config import ConfigError
from slime.plan.validate import validate
from tests.helpers.compose import typed_config


def problems_for(overrides: list[str], output_dir: Path) -> dict[str, str]:
    """Validation's problems by key (several joined by " | "); validation must not create the run directory."""
    with pytest.raises(ConfigError) as info:
        validate(typed_config(overrides, str(output_dir)))
    assert not output_dir.exists(), "validation created the run directory"
    found: dict[str, str] = {}
    for problem in info.value.problems:  # a key may have several problems
        found[problem.key] = f"{found[problem.key]} | {problem}" if problem.key in found else str(problem)
    return found


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` with its sha256: compare before and after to show nothing was damaged."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def config_problems(overrides: list[str]) -> dict[str, str]:
    """Validation's problems by key (one per key: the last) of the config composed with `overrides`."""
    with pytest.raises(ConfigError) as info:
        validate(typed_config(overrides))
    return {p.key: str(p) for p in info.value.problems}
