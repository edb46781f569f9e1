"""tools/<name>.py as a module, so a test runs its main(argv) in this process (tools/ is no package)."""

from __future__ import annotations

import importlib.util

from tests.helpers.compose import ROOT


def load_tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
