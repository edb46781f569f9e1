"""Which optional set-ups the chosen tests need, so that `bash tools/test.sh PATHS...` installs only those.

    python -m tests.helpers.setup_needs [PYTEST ARGS...]    # the set-up scripts, one a line

The base set-up (`tools/setup.sh test`: the project, pytest, ruff, megatron-core, the sweeper) always runs. Four
more are needed by some tests only: SGLang's CPU wheel (the contract tests and the fake SGLang server), vLLM on CPU
(the real-vLLM tests and the fake vLLM server, which runs vLLM's own code), SmolLM2 (the real pretrained model) and
torchao (the FP8 tests, outside the environment's site-packages).
A test file needs one when its text, or the text of a test helper it imports (transitively), names the part (the
patterns below). Arguments that are not existing paths inside the checkout (options and their values) are ignored; no path means the
whole suite, which needs all four. A pattern that matches too much installs more than needed; one that matches
too little makes a test fail naming the script to run, never skip.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.helpers.compose import ROOT

# script -> what, in a test file or a helper it imports, means the tests need it
NEEDS = {
    "tools/setup_sglang_cpu.sh": re.compile(r"\b(sglang_real|sglang_probe|sglang_routes|fake_sglang\w*)\b"),
    "tools/setup_vllm_cpu.sh": re.compile(
        r"\b(vllm_real|fake_vllm\w*|vllm_slow_step)\b|^\s*(import vllm|from vllm\b)", re.MULTILINE
    ),
    "tools/setup_smollm2.sh": re.compile(r"\bsmollm2_dir\b|\bmodel=smollm2_135m\b|\brecipe=smollm2_arithmetic\b"),
    "tools/setup_torchao_cpu.sh": re.compile(r"\btorchao_site\b"),
}
_LOCAL_IMPORT = re.compile(r"^\s*(?:from|import)\s+(tests\.(?:helpers|fakes)\.\w+)", re.MULTILINE)


def _module_file(module: str, root: Path) -> Path | None:
    path = root / (module.replace(".", "/") + ".py")
    return path if path.is_file() else None


def _texts(test_file: Path, root: Path) -> list[str]:
    """The file's text and the texts of the test helpers it imports, transitively."""
    seen: set[Path] = set()
    pending, texts = [test_file], []
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        text = path.read_text()
        texts.append(text)
        pending += [f for m in _LOCAL_IMPORT.findall(text) if (f := _module_file(m, root)) is not None]
    return texts


def _test_files(args: list[str], root: Path) -> list[Path] | None:
    """The test files the arguments name (a node id counts as its file); None when they name no path."""
    paths = [(root / arg.split("::")[0]).resolve() for arg in args if not arg.startswith("-")]
    paths = [p for p in paths if p.exists() and p.is_relative_to(root.resolve())]  # not an option's value
    if not paths:
        return None
    files: list[Path] = []
    for path in paths:
        files += sorted(path.rglob("test_*.py")) if path.is_dir() else [path]
    return [f for f in files if "__pycache__" not in f.parts]


def needed_setups(args: list[str], root: Path = ROOT) -> list[str]:
    """The optional set-up scripts (relative to `root`) that the tests `args` select need, in NEEDS' order."""
    files = _test_files(args, root)
    if files is None:
        return list(NEEDS)
    texts = [text for f in files for text in _texts(f, root)]
    return [script for script, pattern in NEEDS.items() if any(pattern.search(text) for text in texts)]


if __name__ == "__main__":
    print("\n".join(needed_setups(sys.argv[1:])))
