"""The test tree's own rules (tests/README.md), checked on the tests' source and on pytest's collection.

Unit tests mirror the package, end-to-end runs live in tests/e2e (all `slow`), the GPU tier in tests/gpu (all
`gpu`); no loose test modules at the top; test modules share code only through tests/helpers and tests/fakes;
tools/test.sh's end-to-end process collects every file with a slow test (tests/helpers/slow_files.py).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.slow_files import AFTER_UNIT_FILES, lane_files, slow_files, unlisted

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# The architecture checks: they read the whole source tree, so they belong to no package folder.
TOP_LEVEL_TESTS = {"test_layers.py", "test_test_tree.py"}
SHARED = ("tests.helpers", "tests.fakes")
RUNS_MAIN = {"main_py", "main_argv", "main_py_concurrently", "run_concurrently"}  # tests.helpers.runs


def _test_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def _imported_test_modules(path: Path) -> list[str]:
    """`tests.*` modules that `path` imports (anywhere in it, functions included) other than helpers and fakes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "tests" else [f"tests.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if (name == "tests" or name.startswith("tests.")) and not name.startswith(SHARED):
                found.append(f"{path}:{node.lineno} imports {name}")
    return found


def test_no_loose_test_modules_at_the_top():
    loose = {p.name for p in TESTS.glob("test_*.py")} - TOP_LEVEL_TESTS
    assert not loose, f"move these into tests/<package>/ (or tests/e2e/ for main.py runs): {sorted(loose)}"


def test_no_test_module_imports_another():
    """conftest.py files, test modules, helpers and fakes import shared code from tests.helpers / tests.fakes only
    (conftest fixtures reach tests by name, never by import)."""
    sources = sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)
    assert [found for path in sources for found in _imported_test_modules(path)] == []


def test_shared_code_lives_in_helpers_or_fakes():
    """Every module outside tests/helpers and tests/fakes is a test module or a conftest.py."""
    stray = [
        str(p.relative_to(ROOT))
        for p in TESTS.rglob("*.py")
        if "__pycache__" not in p.parts
        and p.parent.name not in ("helpers", "fakes")
        and not (p.name.startswith("test_") or p.name == "conftest.py")
    ]
    assert stray == [], "move these to tests/helpers/"


def test_the_rules_see_an_import_of_a_test_module(tmp_path):
    """The import check finds each form: module level, inside a function, `import tests.x as y`, conftest."""
    module = tmp_path / "test_sample.py"
    module.write_text(
        "from tests.helpers.compose import ROOT\n"
        "from tests.conftest import typed_config\n"
        "import tests.config.test_config as test_config\n"
        "def f():\n    from tests.e2e import test_end_to_end\n"
    )
    found = [line.split(" imports ")[1] for line in _imported_test_modules(module)]
    assert found == ["tests.conftest", "tests.config.test_config", "tests.e2e"]


def _slow_tests_running_main(path: Path) -> list[str]:
    """Tests of `path` marked `slow` (or in a `slow` module) that start main.py (through tests.helpers.runs or by
    its file name)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    slow_module = any(
        isinstance(node, ast.Assign) and "pytestmark" in ast.unparse(node) and ".slow" in ast.unparse(node)
        for node in tree.body
    )
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
            continue
        slow = slow_module or any(ast.unparse(d).endswith("mark.slow") for d in node.decorator_list)
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if slow and (
            names & RUNS_MAIN or any(isinstance(n, ast.Constant) and n.value == "main.py" for n in ast.walk(node))
        ):
            found.append(f"{path}::{node.name}")
    return found


def test_main_py_runs_live_in_e2e():
    """A slow test that runs the whole product (`python main.py` to its end) belongs in tests/e2e/."""
    outside = [p for p in _test_modules() if p.parent != TESTS / "e2e"]
    assert [found for path in outside for found in _slow_tests_running_main(path)] == []


def test_the_rules_see_a_slow_main_py_run(tmp_path):
    module = tmp_path / "test_sample.py"
    module.write_text(
        "import pytest\n"
        "@pytest.mark.slow\ndef test_run(tmp_path):\n    main_py(tmp_path)\n"
        "def test_cli(tmp_path):\n    main_py(tmp_path)\n"
        "@pytest.mark.slow\ndef test_sweep():\n    subprocess.run([sys.executable, 'main.py', '--multirun'])\n"
    )
    assert _slow_tests_running_main(module) == [f"{module}::test_run", f"{module}::test_sweep"]


def test_test_module_names_are_unique():
    """pytest imports a test module by its file name (no __init__.py here): two alike would collide."""
    by_name: dict[str, list[str]] = {}
    for path in _test_modules():
        by_name.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


@pytest.mark.parametrize(("folder", "marker"), [("e2e", "slow"), ("gpu", "gpu")])
def test_every_test_of_a_tier_folder_carries_its_marker(folder, marker):
    """Collection deselects nothing but the unmarked: with `-m "not <marker>"` the folder has no test left."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", f"not {marker}"]
        + [str(TESTS / folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    unmarked = [line for line in proc.stdout.splitlines() if "::" in line]
    assert proc.returncode == 5 and not unmarked, f"not marked `{marker}`:\n" + "\n".join(unmarked or [proc.stdout])
    assert "deselected" in proc.stdout, proc.stdout  # the folder has tests, all deselected by the marker


def test_the_slow_files_are_those_with_a_slow_mark():
    found = slow_files()
    assert "tests/e2e/test_end_to_end.py" in found and "tests/rollout/manager/test_fault_tolerance.py" in found
    assert all(name.startswith("tests/") and name.endswith(".py") for name in found)
    assert "tests/test_test_tree.py" not in found  # it writes the mark in strings, marks nothing


def test_the_two_lanes_split_the_slow_files():
    """tools/test.sh's runs process and the unit tests' lane together collect every slow file, each once."""
    runs, after_unit = lane_files("runs"), lane_files("after-unit")
    assert after_unit == sorted(AFTER_UNIT_FILES) and not set(runs) & set(after_unit)
    assert sorted(runs + after_unit) == slow_files()


def test_a_lane_file_without_a_slow_test_is_refused(tmp_path):
    (tmp_path / "tests" / "e2e").mkdir(parents=True)
    with pytest.raises(ValueError, match="AFTER_UNIT_FILES names files with no slow test"):
        lane_files("runs", tmp_path)


def test_a_slow_test_in_a_file_without_the_mark_is_reported(tmp_path):
    """A slow test the text scan missed (a mark it does not read, e.g. a parametrized case's) is named."""
    tests = tmp_path / "tests" / "e2e"
    tests.mkdir(parents=True)
    (tests / "test_other.py").write_text("import pytest\n\n@pytest.mark.slow\ndef test_run(): ...\n")
    (tests / "test_module.py").write_text("import pytest\npytestmark = [pytest.mark.slow]\n")
    (tests / "test_param.py").write_text("import pytest\nCASES = [pytest.param(1, marks=[pytest.mark.slow])]\n")
    assert slow_files(tmp_path) == ["tests/e2e/test_module.py", "tests/e2e/test_other.py"]
    missed = {"tests/e2e/test_other.py", "tests/e2e/test_param.py"}
    assert unlisted(missed, tmp_path) == ["tests/e2e/test_param.py"]
