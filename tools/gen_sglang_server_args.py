"""Regenerate slime/engine/sglang/server_args_fields.json: every ServerArgs field of one SGLang version, with
the command-line action SGLang's own parser registers for it.

    python tools/gen_sglang_server_args.py           # write the JSON
    python tools/gen_sglang_server_args.py --print   # print it instead (the contract test compares the two)

The parser is built exactly as `sglang/srt/server_args.py:prepare_server_args` builds it
(`argparse.ArgumentParser()` + `ServerArgs.add_cli_args`), from the importable sglang, or where it does not
import (the CPU install: no triton) from the pinned wheel in `.venv/sglang-cpu` through
`tests.helpers.sglang_real.bootstrap()` (`bash tools/setup_sglang_cpu.sh` installs it).

Per field: `type` and `default` as written in the source (read with `ast`), and `cli`, the argparse action
whose dest is the field (the first one registered: a deprecated alias registered later never wins), or
null when SGLang registers none (the field cannot be set at launch):

    flag, option_strings, dest   the option string actually registered first, all of them, the dest
    action                       store | store_true | store_false | boolean_optional | store_const | custom
    class                        the action class's name, for custom actions
    type                         the argparse type by name: int, float, str, json.loads or a function's name
    value_type                   what that type makes of a command-line word: int, float, str, json (a JSON
                                 object or list from one word), or null when it cannot tell
    nargs, choices, const, default   as registered (sets of choices sorted)

There is no mode that reads a wheel without importing it: the actions exist only once `add_cli_args` has
run (names, types and choices come from `Arg` metadata, `Literal` annotations and choices computed then).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "slime" / "engine" / "sglang" / "server_args_fields.json"
SERVER_ARGS = "sglang/srt/server_args.py"
_KINDS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "BooleanOptionalAction": "boolean_optional",
    "_StoreConstAction": "store_const",
}


def load_server_args() -> tuple[type, str, Path, str]:
    """(ServerArgs, version, the directory holding the `sglang` package, how it was imported)."""
    try:
        import sglang
        from sglang.srt.server_args import ServerArgs

        how = "the installed sglang"
    except Exception:  # absent, or present without its GPU stack: the pinned CPU wheel
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]  # a half-imported package would shadow the bootstrapped one
        sys.path.insert(0, str(ROOT))
        from tests.helpers.sglang_real import bootstrap

        with contextlib.redirect_stdout(sys.stderr):
            sglang = bootstrap()
            from sglang.srt.server_args import ServerArgs
        how = "the pinned wheel in .venv/sglang-cpu (tests.helpers.sglang_real.bootstrap)"
    return ServerArgs, sglang.__version__, Path(sglang.__path__[0]).parent, how


def generate() -> dict:
    """{sglang_version, source, generated_by, fields: {name: {type, default, cli}}}, public fields sorted."""
    ServerArgs, version, package_root, how = load_server_args()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    actions = record_actions(parser)
    written = server_args_fields(_Sources(package_root))
    fields = {}
    for name in _field_names(ServerArgs):
        fields[name] = {**written.get(name, {"type": "", "default": ""}), "cli": actions.get(name)}
    return {
        "sglang_version": version,
        "source": f"ServerArgs.add_cli_args of {how}",
        "generated_by": "tools/gen_sglang_server_args.py",
        "fields": public(fields),
    }


def _field_names(server_args: type) -> list[str]:
    """ServerArgs' fields: a dataclass up to 0.5.x, a msgspec struct assembled from namespaces later."""
    if dataclasses.is_dataclass(server_args):
        return [f.name for f in dataclasses.fields(server_args)]
    import msgspec.structs

    return [f.name for f in msgspec.structs.fields(server_args)]


def record_actions(parser: argparse.ArgumentParser) -> dict[str, dict]:
    """dest -> the first action registered for it (see the module docstring for the keys)."""
    recorded: dict[str, dict] = {}
    for action in parser._actions:  # argparse keeps no public list of its actions
        if not action.option_strings or action.dest in recorded or action.dest == "help":
            continue
        kind = _KINDS.get(type(action).__name__, "custom")
        record = {
            "flag": action.option_strings[0],
            "option_strings": list(action.option_strings),
            "dest": action.dest,
            "action": kind,
            "type": _type_name(action.type),
            "value_type": None if action.nargs == 0 else _value_type(action.type),
            "nargs": action.nargs,
            "choices": _jsonable(sorted(action.choices) if isinstance(action.choices, set) else action.choices),
            "const": _jsonable(action.const),
            "default": _jsonable(action.default),
        }
        if kind == "custom":
            record["class"] = type(action).__name__
        if kind == "boolean_optional":
            record["no_flag"] = next(s for s in action.option_strings if s.startswith("--no-"))
        recorded[action.dest] = record
    return recorded


def _type_name(func: Any) -> str | None:
    if func is None:
        return None
    name = getattr(func, "__name__", repr(func))
    return f"json.{name}" if getattr(func, "__module__", "") == "json" else name


def _value_type(func: Any) -> str | None:
    """What `func` makes of one command-line word: json when "{}" or "[]" becomes an object or list, else the
    type of what "1" becomes (argparse passes words unchanged without a type: str)."""
    if func is None:
        return "str"
    for word in ("{}", "[]"):
        with contextlib.suppress(Exception):
            if isinstance(func(word), (dict, list)):
                return "json"
    try:
        made = func("1")
    except Exception:  # a parser that takes no plain number: nothing to say about its values
        return None
    return {int: "int", float: "float", str: "str"}.get(type(made))


def _jsonable(value: Any) -> Any:
    """JSON data as is, tuples as lists; anything else by repr (a default that no command line produces)."""
    if isinstance(value, tuple):
        value = list(value)
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


class _Sources(dict):
    """Module source by path ("sglang/srt/server_args.py"), read from the package's directory on first use."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root

    def __missing__(self, path: str) -> str:
        self[path] = (self.root / path).read_text()
        return self[path]


def server_args_fields(sources: dict[str, str]) -> dict[str, dict[str, str]]:
    """Field name -> {"type", "default"} as written in ServerArgs' source, from the package's module sources.

    Up to 0.5.x ServerArgs was one dataclass; later 0.5.x releases assemble it from the namespace classes
    listed in `_INPUT_NAMESPACES` (sglang/srt/arg_groups/fields/*.py), followed through `from ... import`.
    """
    tree = ast.parse(sources[SERVER_ARGS])
    server_args = _class(tree, "ServerArgs")
    own = _annotated_fields(server_args)
    namespaces = _namespace_names(tree)
    if not namespaces:
        return own
    imports = _imported_from(tree)
    fields: dict[str, dict[str, str]] = {}
    for name in namespaces:
        module = imports[name]
        cls = _class(ast.parse(sources[module.replace(".", "/") + ".py"]), name)
        fields.update(_annotated_fields(cls))
    fields.update(own)
    return fields


def public(fields: dict[str, dict]) -> dict[str, dict]:
    """Underscore fields are SGLang's own bookkeeping (e.g. `_x_explicitly_set`), not settings."""
    return {name: spec for name, spec in sorted(fields.items()) if not name.startswith("_")}


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise SystemExit(f"class {name} not found")


def _annotated_fields(cls: ast.ClassDef) -> dict[str, dict[str, str]]:
    """`name: T = default` lines of a class body; ClassVar and `A[T, help]` wrappers handled."""
    fields = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        annotation = node.annotation
        if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in ("A", "Annotated"):
            elements = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
            annotation = elements[0]
        text = ast.unparse(annotation)
        if text.startswith(("ClassVar", "typing.ClassVar")):
            continue
        fields[node.target.id] = {"type": text, "default": ast.unparse(node.value) if node.value else ""}
    return fields


def _namespace_names(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets
        ):
            return [elt.id for elt in node.value.elts]
    return []


def _imported_from(tree: ast.Module) -> dict[str, str]:
    return {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--print", action="store_true", help="print the JSON to stdout instead of writing --out")
    args = parser.parse_args()
    text = json.dumps(generate(), indent=1) + "\n"
    if args.print:
        sys.stdout.write(text)
        return
    args.out.write_text(text)
    data = json.loads(text)
    silent = [name for name, spec in data["fields"].items() if spec["cli"] is None]
    print(
        f"{args.out}: {len(data['fields'])} ServerArgs fields of sglang {data['sglang_version']}, {len(silent)} without a flag"
    )


if __name__ == "__main__":
    main()
