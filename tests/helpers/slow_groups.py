"""The end-to-end (`slow`) test files in two groups, which tools/test.sh runs as two pytest processes beside the unit
tests: a run spends most of its wall time waiting (processes starting, engines answering), so one pytest process of
runs leaves a core idle; two keep both busy once the unit tests end.

    python -m tests.helpers.slow_groups first    # the files of the first group, one a line (second: the others)

The first group holds the modules with the longest runs (the 60-rollout learning runs); the second every other file
with a slow test, so a new one is never left out. The unit tests' session checks that every collected slow test is
in one of the two (tests/conftest.py, with GROUPED_VAR set)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GROUPED_VAR = "SLIME_SLOW_GROUPED"  # set by tools/test.sh for the unit tests' session: check the grouping
SLOW_MARK = re.compile(r"^\s*(@pytest\.mark\.slow\b|pytestmark\s*=.*\bpytest\.mark\.slow\b)", re.MULTILINE)
FIRST = (
    "tests/e2e/test_end_to_end.py",
    "tests/e2e/test_algorithms.py",
    "tests/e2e/test_smollm2_recipe.py",
    "tests/e2e/test_exact_resume.py",
    "tests/e2e/test_determinism.py",
    "tests/e2e/test_tool_use_recipe.py",
    "tests/e2e/test_epochs_main.py",
    "tests/e2e/test_async_run.py",
)


def slow_files(root: Path = ROOT) -> list[str]:
    """Test files (relative to `root`) that mark a test, or the whole module, `slow`."""
    return sorted(
        str(path.relative_to(root))
        for path in (root / "tests").rglob("test_*.py")
        if "__pycache__" not in path.parts and SLOW_MARK.search(path.read_text())
    )


def groups(root: Path = ROOT) -> dict[str, list[str]]:
    """{"first": FIRST, "second": every other slow file}; a FIRST entry without a slow test is an error."""
    found = slow_files(root)
    stray = [name for name in FIRST if name not in found]
    if stray:
        raise ValueError(f"tests/helpers/slow_groups.py FIRST names files without a slow test: {stray}")
    return {"first": list(FIRST), "second": [name for name in found if name not in FIRST]}


def ungrouped(slow_test_files: set[str], root: Path = ROOT) -> list[str]:
    """The files (relative to `root`) of collected slow tests that neither group runs."""
    grouped = {name for files in groups(root).values() for name in files}
    return sorted(slow_test_files - grouped)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("first", "second"):
        print("usage: python -m tests.helpers.slow_groups first|second", file=sys.stderr)
        return 2
    print("\n".join(groups()[argv[0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
