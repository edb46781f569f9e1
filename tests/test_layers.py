"""The seam rules (docs/architecture.md#import-rules), checked on the source: who may import what.

- slime/algo: tensors in, tensors and metrics out: torch and the standard library only; its records (the estimators,
  their spec and checks) import no torch and may read slime.registry and slime.config.
- Ray only in the two processes' packages, slime/driver and slime/rollout/manager: backends, engines and sync
  classes are plain classes that Ray wraps.
- megatron only in slime/train/megatron; sglang only in slime/engine/sglang; vllm only in slime/engine/vllm.
- slime/config imports no heavy library at module level (validation runs before anything starts), and no
  other slime package at all (it is the leaf).
- megatron, sglang, vllm and triton are optional: every module outside their homes imports without them.
- No import cycle between slime packages (slime/<name>/ and the top-level modules slime/<name>.py), counting
  imports at module level, under TYPE_CHECKING and inside functions, and import paths written as strings;
  slime/train never imports slime/engine; slime/rollout never imports slime/driver (the layer above it).
- slime/registry.py names no part; no class or function of the project is loaded by a string path.
- Fewer than 10 imports inside functions in all of slime, each with a comment (on its line or the line above)
  saying why it cannot be at module level (an optional library, a module that must stay light).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.compose import ROOT

PACKAGE = ROOT / "slime"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def imported_names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """Absolute dotted names one import statement imports (relative ones resolved against `package`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        return [f"{base}.{node.module}" if node.module else base]
    return [node.module]


def imports(path: Path, *, module_level_only: bool = False) -> set[str]:
    """Absolute dotted names imported by the file (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(imported_names(node, package))
    return found


def function_level_imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Import statements inside a function or method body of the file."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text()), False)
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


# slime/algo's modules that describe its parts rather than compute (the estimators' records, their spec and checks):
# torch-free, they may read the registry and the config leaf
ALGO_RECORDS = {"algo/estimators.py", "algo/spec.py", "algo/check.py"}


def test_algo_is_pure_torch():
    def allowed(rel: str, name: str) -> bool:
        records = rel in ALGO_RECORDS and (name == "slime.registry" or name.startswith("slime.config"))
        return top(name) in STDLIB | {"torch"} or name.startswith("slime.algo") or records

    assert offenders(lambda rel, name: not allowed(rel, name), under="algo") == []


def test_the_algo_records_import_no_torch():
    assert offenders(lambda rel, name: rel in ALGO_RECORDS and top(name) == "torch", under="algo") == []


def test_the_scanner_sees_imports():
    assert "ray" in imports(PACKAGE / "driver" / "driver.py")
    assert "ray" in imports(PACKAGE / "rollout" / "manager" / "actor.py")
    assert "slime.engine.http_client" in imports(PACKAGE / "engine" / "client.py")
    assert "transformers" in imports(PACKAGE / "train" / "fsdp" / "critic.py", module_level_only=True)
    assert "slime.train.layout" in imports(PACKAGE / "train" / "base.py")  # a relative-free absolute import


RAY_HOMES = ("driver/", "rollout/manager/")  # the driver's process and the rollout manager's


def test_ray_only_in_the_two_processes_packages():
    assert offenders(lambda rel, name: top(name) == "ray" and not rel.startswith(RAY_HOMES)) == []


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


OPTIONAL_HOMES = {
    "megatron": "slime.train.megatron",
    "sglang": "slime.engine.sglang",
    "vllm": "slime.engine.vllm",
    "triton": "slime.wire.digest_kernel",  # comes with CUDA builds of torch; weight_digest imports it if present
}

# Imports every slime module outside the optional libraries' homes with those libraries blocked (a meta-path
# finder raises ImportError for them, as on an install that lacks them); prints the count and what failed.
IMPORT_WITHOUT_OPTIONAL = """
import importlib, importlib.abc, json, pkgutil, sys
homes = json.loads(sys.argv[1])

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in homes:
            raise ImportError(f"{name} is blocked: an optional library (tests/test_layers.py)")
        return None

sys.meta_path.insert(0, Blocked())
import slime
names = [m.name for m in pkgutil.walk_packages(slime.__path__, "slime.")]
outside = [n for n in names if not any(n == h or n.startswith(h + ".") for h in homes.values())]
failed = {}
for name in outside:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"imported": len(outside) - len(failed), "failed": failed}))
"""


def test_every_module_outside_the_optional_homes_imports_without_them():
    """megatron, sglang, vllm and triton are optional; the CPU install lacks some of them and must still
    import every other module (megatron's home may import megatron-core at module level: the registry loads it
    only when `parallelism.backend=megatron`)."""
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_WITHOUT_OPTIONAL, json.dumps(OPTIONAL_HOMES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["failed"] == {}
    assert result["imported"] > 50


def test_the_import_blocker_blocks():
    """The blocker above is real: with torch blocked, a module that imports torch fails to import."""
    only_the_home = IMPORT_WITHOUT_OPTIONAL.replace("if not any(n == h", "if any(n == h")
    proc = subprocess.run(
        [sys.executable, "-c", only_the_home, json.dumps({"torch": "slime.wire.tensors"})],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["imported"] == 0 and "torch is blocked" in result["failed"]["slime.wire.tensors"], result


# ---------------------------------------------------------------------------- packages
def slime_package(module: str) -> str | None:
    """`slime.train.fsdp.backend` -> "train", `slime.registry` -> "registry"; None outside slime."""
    parts = module.split(".")
    return parts[1] if parts[0] == "slime" and len(parts) > 1 else None


def package_edges() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> "file:line imports module" for every import between two
    slime packages, wherever it stands in the file (module level, TYPE_CHECKING, inside a function)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in files(""):
        rel = path.relative_to(ROOT)
        source = slime_package(".".join(rel.with_suffix("").parts))
        package = ".".join(rel.with_suffix("").parts[:-1])
        tree = ast.parse(path.read_text())
        named = [
            (node.lineno, name, "imports")
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in imported_names(node, package)
        ]
        named += [(lineno, name, "names") for lineno, name in string_paths(path)]
        for lineno, name, how in named:
            target = slime_package(name)
            if target and target != source:
                edges.setdefault((source, target), []).append(f"{rel}:{lineno} {how} {name}")
    return edges


SLIME_PATH = re.compile(r"^slime(\.[A-Za-z_]\w*)+$")
RELATIVE_PATH = re.compile(r"^(\.[A-Za-z_]\w*)+$")


def string_paths(path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every string constant of the file that is a slime import path, docstrings
    left out; in a spec module (spec.py) also the paths relative to its package (`.engine.HFEngine`)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in docstrings:
            continue
        if SLIME_PATH.match(node.value):
            found.append((node.lineno, node.value))
        elif path.name == "spec.py" and RELATIVE_PATH.match(node.value):
            found.append((node.lineno, package + node.value))
    return found


def is_module(name: str) -> bool:
    """`slime.engine.hf.server` is a module (or package) of the checkout; `slime.engine.hf.engine.HFEngine` is not."""
    where = ROOT.joinpath(*name.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file() or where.is_dir()


def cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one package (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_cycles():
    assert cycles({("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("c", "d"): []}) == [["a", "b", "c"]]
    assert cycles({("a", "b"): [], ("b", "c"): []}) == []
    edges = package_edges()
    assert ("driver", "train") in edges and ("sync", "engine") in edges  # the scanner sees package imports
    assert ("driver", "rollout") in edges  # the driver imports the rollout manager's package


def test_no_import_cycle_between_packages():
    edges = package_edges()
    report = []
    for component in cycles(edges):
        inside = [(a, b) for (a, b) in edges if a in component and b in component]
        report.append({"packages": component, "imports": [edges[e][0] for e in sorted(inside)]})
    assert report == []


def test_the_scanner_sees_import_paths_written_as_strings():
    spec = PACKAGE / "engine" / "vllm" / "spec.py"
    assert "slime.engine.vllm.engine.VLLMEngine" in {name for _, name in string_paths(spec)}
    assert (52, "slime.engine.hf.server") in string_paths(PACKAGE / "engine" / "hf" / "engine.py")  # python -m
    assert not string_paths(PACKAGE / "registry.py")  # its docstring names spec files, which are not code


def test_the_registry_names_no_part():
    """slime/registry.py finds the parts' spec modules: it imports no slime package but the config leaf and names
    no slime module in a string."""
    imported = {name for name in imports(PACKAGE / "registry.py") if top(name) == "slime"}
    assert {slime_package(name) for name in imported} <= {"config"}, imported
    assert string_paths(PACKAGE / "registry.py") == []


def test_no_class_or_function_of_the_project_is_loaded_by_a_string_path():
    """A string naming a slime module is a module name (a server started with `python -m`, a logger); one naming a
    class or a function is an import that should be written as one (a part's spec names its own by relative path).
    """
    named = [
        (f"{p.relative_to(ROOT)}:{line}", n) for p in files("") if p.name != "spec.py" for line, n in string_paths(p)
    ]
    assert [f"{where} names {name}" for where, name in named if not is_module(name)] == []


def test_train_never_imports_engine():
    assert package_edges().get(("train", "engine"), []) == []


def test_rollout_never_imports_driver():
    """The rollout manager's process is the layer under the driver's: what both use (the bundles an actor is placed
    on, the errors naming a dead engine, a worker's logging and stack dump) lives in slime/rollout/manager."""
    assert package_edges().get(("rollout", "driver"), []) == []


# ---------------------------------------------------------------------------- imports inside functions
# Each keeps an optional or slow library (wandb, pyarrow, torch and transformers in the driver, peft: 4 s, in
# every fsdp rank and in an hf engine serving LoRA adapters, torchao in a rank training in fp8, the rollout producer
# in the rollout manager's process) off the paths that never use it; 15 today.
MAX_FUNCTION_LEVEL_IMPORTS = 16


def commented(lines: list[str], lineno: int) -> bool:
    """A `#` comment on the import's line or alone on the line above."""
    line, above = lines[lineno - 1], lines[lineno - 2].strip() if lineno > 1 else ""
    return "#" in line or above.startswith("#")


def test_few_imports_inside_functions_each_saying_why():
    found, uncommented = [], []
    for path in files(""):
        lines = path.read_text().splitlines()
        for node in function_level_imports(path):
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            found.append(where)
            if not commented(lines, node.lineno):
                uncommented.append(where)
    assert uncommented == []
    assert len(found) < MAX_FUNCTION_LEVEL_IMPORTS, found


def test_the_function_import_scanner_sees_them(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\n\ndef f():\n    import json  # optional\n\n    def g():\n        import re\n")
    nodes = function_level_imports(path)
    assert [n.lineno for n in nodes] == [4, 7]
    lines = path.read_text().splitlines()
    assert commented(lines, 4) and not commented(lines, 7)
