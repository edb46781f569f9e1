"""Regenerate slime/engine/sglang/server_args_fields.json: the ServerArgs fields of one SGLang version.

`rollout.sglang` keys are checked against this list where sglang itself is not importable (the CPU
install, CI). Two sources, the first that applies:

    python tools/gen_sglang_server_args.py                    # the installed sglang (its ServerArgs fields)
    python tools/gen_sglang_server_args.py --version 0.5.23   # `pip download --no-deps sglang==0.5.23`, read with ast

The second never imports sglang (it needs a GPU stack): it reads `sglang/srt/server_args.py` from the
wheel with `ast`. Up to 0.5.x ServerArgs was one dataclass there; later 0.5.x releases assemble it from
the namespace classes listed in `_INPUT_NAMESPACES` (sglang/srt/arg_groups/fields/*.py), which are
followed through the module's `from ... import` lines.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "slime" / "engine" / "sglang" / "server_args_fields.json"
SERVER_ARGS = "sglang/srt/server_args.py"


def from_installed() -> dict | None:
    """{version, source, fields} from an importable sglang, or None when it is not importable."""
    try:
        import sglang
        from sglang.srt.server_args import ServerArgs
    except Exception:  # absent, or present without its GPU stack: use a wheel instead
        return None
    if dataclasses.is_dataclass(ServerArgs):
        fields = {f.name: {"type": str(f.type)} for f in dataclasses.fields(ServerArgs)}
    else:  # later 0.5.x: a msgspec struct
        import msgspec.structs

        fields = {f.name: {"type": str(f.type)} for f in msgspec.structs.fields(ServerArgs)}
    return {"sglang_version": sglang.__version__, "source": "installed sglang", "fields": fields}


def from_wheel(version: str) -> dict:
    """{version, source, fields} parsed with ast from the sglang==version wheel (downloaded, never imported)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"sglang=={version}", "-d", tmp],
            check=True,
        )
        wheels = list(Path(tmp).glob("sglang-*.whl"))
        if not wheels:
            raise SystemExit(f"pip downloaded no sglang wheel for {version} (sdist only?)")
        with zipfile.ZipFile(wheels[0]) as wheel:
            sources = {name: wheel.read(name).decode() for name in wheel.namelist() if name.endswith(".py")}
    fields = server_args_fields(sources)
    return {"sglang_version": version, "source": f"ast of {wheels[0].name}", "fields": fields}


def server_args_fields(sources: dict[str, str]) -> dict[str, dict[str, str]]:
    """Field name -> {"type", "default"} of ServerArgs, from the package's module sources by path."""
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


def public(fields: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
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
    parser.add_argument("--version", help="read this sglang version's wheel instead of the installed sglang")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    data = from_wheel(args.version) if args.version else from_installed()
    if data is None:
        raise SystemExit("sglang is not importable here: pass --version X.Y.Z to read that version's wheel")
    data["fields"] = public(data["fields"])
    data["generated_by"] = "tools/gen_sglang_server_args.py"
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.out}: {len(data['fields'])} ServerArgs fields of sglang {data['sglang_version']}")


if __name__ == "__main__":
    main()
