"""DESIGN.md §3's seam rules, checked on the source: who may import what.

- slime/algo: tensors in, tensors and metrics out: torch and the standard library only.
- Ray only in slime/runtime: backends, engines and sync classes are plain classes that Ray wraps.
- megatron only in slime/train/megatron; sglang only in slime/engine/sglang; vllm only in slime/engine/vllm.
- slime/config imports no heavy library at module level (validation runs before anything starts), and no
  other slime package at all (it is the leaf).
- Every module imports on this machine, which has neither sglang, vllm nor megatron-core.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "slime"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def imports(path: Path, *, module_level_only: bool = False) -> set[str]:
    """Absolute dotted names imported by the file (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.add(f"{base}.{node.module}" if node.module else base)
            else:
                found.add(node.module)
    return found


def files(under: str) -> list[Path]:
    return sorted((PACKAGE / under).rglob("*.py")) if under else sorted(PACKAGE.rglob("*.py"))


def offenders(rule, *, under: str = "", module_level_only: bool = False) -> list[str]:
    out = []
    for path in files(under):
        for name in imports(path, module_level_only=module_level_only):
            if rule(path.relative_to(PACKAGE).as_posix(), name):
                out.append(f"{path.relative_to(ROOT)} imports {name}")
    return out


def top(name: str) -> str:
    return name.split(".")[0]


def test_algo_is_pure_torch():
    allowed = lambda name: top(name) in STDLIB | {"torch"} or name.startswith("slime.algo")  # noqa: E731
    assert offenders(lambda _, name: not allowed(name), under="algo") == []


def test_the_scanner_sees_imports():
    assert "ray" in imports(PACKAGE / "runtime" / "driver.py")
    assert "slime.engine.http_client" in imports(PACKAGE / "engine" / "client.py")
    assert "transformers" in imports(PACKAGE / "train" / "fsdp" / "backend.py")  # a function-level import
    assert "transformers" not in imports(PACKAGE / "train" / "fsdp" / "backend.py", module_level_only=True)


def test_ray_only_in_the_runtime():
    assert offenders(lambda rel, name: top(name) == "ray" and not rel.startswith("runtime/")) == []


@pytest.mark.parametrize(
    "library,home", [("megatron", "train/megatron/"), ("sglang", "engine/sglang/"), ("vllm", "engine/vllm/")]
)
def test_optional_engines_and_backends_stay_in_their_package(library, home):
    assert offenders(lambda rel, name: top(name) == library and not rel.startswith(home)) == []


def test_config_imports_nothing_heavy_at_module_level():
    heavy = {"torch", "ray", "transformers", "megatron", "sglang", "vllm", "wandb"}
    assert offenders(lambda _, name: top(name) in heavy, under="config", module_level_only=True) == []


def test_config_imports_no_other_slime_package():
    """slime/config is the leaf every package may import: it imports nothing else from slime, at module level or
    inside functions (validation that needs the chosen parts lives in slime/plan/validate.py)."""
    other = lambda name: top(name) == "slime" and not name.startswith("slime.config")  # noqa: E731
    assert offenders(lambda _, name: other(name), under="config") == []


def test_the_config_scanner_sees_slime_imports():
    assert "slime.config.schema" in imports(PACKAGE / "config" / "loader.py")
    assert "slime.engine.groups" in imports(PACKAGE / "plan" / "derive.py")


def test_every_module_imports_without_optional_libraries():
    code = (
        "import importlib, pkgutil, sys, slime\n"
        "names = [m.name for m in pkgutil.walk_packages(slime.__path__, 'slime.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "loaded = sorted(m for m in ('sglang', 'vllm', 'megatron') if m in sys.modules)\n"
        "print(len(names), loaded)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, loaded = proc.stdout.split(maxsplit=1)
    assert int(count) > 50 and loaded.strip() == "[]"
