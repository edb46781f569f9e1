"""The end-to-end (`slow`) test files, which tools/test.sh runs beside the unit tests, naming the files so that
a process collects only them (collecting the whole tree imports every test module: ~2 min).

    python -m tests.helpers.slow_files                    # the files, one a line
    python -m tests.helpers.slow_files --lane runs        # those of the runs' process
    python -m tests.helpers.slow_files --lane after-unit  # those the unit tests' lane runs once the unit tests end

A file belongs here when it marks a test, or its whole module, `slow` (the text scan below). The unit tests'
session checks that every collected slow test is in one of these files (tests/conftest.py, with CHECK_VAR set),
so a slow mark the scan cannot read (a parametrized case's) fails CI instead of being skipped.

Two processes of runs beside the unit tests starve a 2-core machine (35-44 threads runnable, a real vLLM server
480 s to start), so at most one process of runs runs beside the unit tests: the unit tests' lane takes the
AFTER_UNIT_FILES once they end, where a core would otherwise idle under the runs' single-run modules (measured:
`PYTEST_ADDOPTS=--durations=50 bash tools/test.sh`, the unit tests end at ~24 of ~45 min and the load falls
to ~1.5)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.helpers.compose import ROOT

# Single-run modules near the end of the runs' order (tests/conftest.py): ~5 min beside the runs' process, and the
# fault runs of test_killed_save_resume.py (~6 min: a save, a router and an engine killed, a NaN step, a full disk, each
# resumed), test_engine_faults.py (~5 min: engines killed in pushes and rollouts) and test_agent_recipe.py (~9 min:
# 150 agent steps on the built-in engine).
AFTER_UNIT_FILES = (
    "tests/e2e/test_agent_recipe.py",
    "tests/e2e/test_engine_faults.py",
    "tests/e2e/test_exact_resume.py",
    "tests/e2e/test_killed_save_resume.py",
    "tests/e2e/test_tool_use_recipe.py",
    "tests/e2e/test_vllm_engine_e2e.py",
)
LANES = ("runs", "after-unit")
CHECK_VAR = "SLIME_CHECK_SLOW_FILES"  # set by tools/test.sh for the unit tests' session: check the files
SLOW_MARK = re.compile(r"^\s*(@pytest\.mark\.slow\b|pytestmark\s*=.*\bpytest\.mark\.slow\b)", re.MULTILINE)


def slow_files(root: Path = ROOT) -> list[str]:
    """Test files (relative to `root`) that mark a test, or the whole module, `slow`."""
    return sorted(
        str(path.relative_to(root))
        for path in (root / "tests").rglob("test_*.py")
        if "__pycache__" not in path.parts and SLOW_MARK.search(path.read_text())
    )


def unlisted(slow_test_files: set[str], root: Path = ROOT) -> list[str]:
    """The files (relative to `root`) of collected slow tests that the runs' process would not collect."""
    return sorted(slow_test_files - set(slow_files(root)))


def lane_files(lane: str, root: Path = ROOT) -> list[str]:
    """The slow files of one lane: "after-unit" the AFTER_UNIT_FILES (each must be a slow file), "runs" the rest."""
    files = slow_files(root)
    missing = sorted(set(AFTER_UNIT_FILES) - set(files))
    if missing:
        raise ValueError(f"AFTER_UNIT_FILES names files with no slow test: {missing}")
    if lane == "after-unit":
        return [f for f in files if f in AFTER_UNIT_FILES]
    return [f for f in files if f not in AFTER_UNIT_FILES]


def main(argv: list[str]) -> int:
    if argv and (len(argv) != 2 or argv[0] != "--lane" or argv[1] not in LANES):
        print(f"usage: python -m tests.helpers.slow_files [--lane {{{','.join(LANES)}}}]", file=sys.stderr)
        return 2
    print("\n".join(lane_files(argv[1]) if argv else slow_files()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
