"""The end-to-end (`slow`) test files, which tools/test.sh runs as one pytest process beside the unit tests, naming
the files so that the process collects only them (collecting the whole tree imports every test module: ~2 min).

    python -m tests.helpers.slow_files    # the files, one a line

A file belongs here when it marks a test, or its whole module, `slow` (the text scan below). The unit tests'
session checks that every collected slow test is in one of these files (tests/conftest.py, with CHECK_VAR set),
so a slow mark the scan cannot read (a parametrized case's) fails CI instead of being skipped.

Three processes (two of runs) were tried: on a 2-core machine the runs alive at once, each with its Ray daemons,
engine and trainer polling, kept 35-44 threads runnable and a real vLLM server took 480 s to start (60-100 s with
one process of runs), so the runs stay in one process."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.helpers.compose import ROOT

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


def main(argv: list[str]) -> int:
    if argv:
        print("usage: python -m tests.helpers.slow_files", file=sys.stderr)
        return 2
    print("\n".join(slow_files()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
