"""SGLang's own code on a CPU machine: the pinned wheel installed without its GPU stack (tools/setup_sglang_cpu.sh).

`bootstrap()` makes `import sglang.srt.<module>` work in the calling process: the wheel's directory goes on
`sys.path`, triton is stood in by SGLang's own stub (`sglang/_platform_stubs.py`, what SGLang installs on Apple
Silicon, where triton does not exist either), and two packages imported at module level for features these
tests never touch (torchvision for multimodal preprocessing, IPython for notebook display) are empty modules.
`sglang/__init__.py` is not run: it loads the front-end language and patches transformers; the server modules
(`sglang.srt.*`) do not need it.

Call it only in processes that exist for SGLang (the contract probe, the fake server): the triton stub would
mislead torch.compile in a process that compiles.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import platform
import sys
import types
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
SGLANG_DIR = ROOT / ".venv" / "sglang-cpu"
PINNED_VERSION = "0.5.23"
_EMPTY_PACKAGES = ("torchvision", "IPython")


class SGLangMissing(RuntimeError):
    """The wheel is not installed where the tests look for it."""


def require() -> Path:
    """The wheel's directory; SGLangMissing (saying how to install it) when it is absent."""
    if not (SGLANG_DIR / "sglang" / "srt" / "server_args.py").is_file():
        raise SGLangMissing(
            f"SGLang {PINNED_VERSION} is not installed in {SGLANG_DIR}: run `bash tools/setup_sglang_cpu.sh` "
            "(tools/test.sh does)"
        )
    return SGLANG_DIR


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose Python finds the wheel (for subprocesses that call `bootstrap()`)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class _EmptyPackages(importlib.abc.MetaPathFinder):
    """`import torchvision...` / `import IPython...` give SGLang's catch-all stub modules."""

    def __init__(self, mock_module: type):
        self.mock_module = mock_module

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in _EMPTY_PACKAGES:
            return None
        module = self.mock_module(fullname)
        sys.modules[fullname] = module
        parent, _, child = fullname.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)
        return module.__spec__


def bootstrap() -> types.ModuleType:
    """Make SGLang's server modules importable here; returns the `sglang` package (its `__version__` set)."""
    if "sglang" in sys.modules and getattr(sys.modules["sglang"], "_slime_bootstrapped", False):
        return sys.modules["sglang"]
    directory = str(require())
    if directory not in sys.path:
        sys.path.append(directory)
    import torch
    import transformers.utils.import_utils  # noqa: F401 - decides "torchvision unavailable" before the stub exists

    package = types.ModuleType("sglang")
    package.__path__ = [str(SGLANG_DIR / "sglang")]
    package.__spec__ = importlib.machinery.ModuleSpec("sglang", None, is_package=True)
    package._slime_bootstrapped = True
    sys.modules["sglang"] = package
    stubs = importlib.import_module("sglang._platform_stubs")
    # install_platform_stubs stubs triton only on Apple Silicon; it also fills missing torch.mps functions and
    # keeps non_blocking copies to "mps" blocking, neither of which a CPU process uses
    with (
        mock.patch.object(sys, "platform", "darwin"),
        mock.patch.object(platform, "machine", return_value="arm64"),
        mock.patch.object(torch.backends.mps, "is_available", return_value=True),
    ):
        stubs.install_platform_stubs()
    sys.meta_path.insert(0, _EmptyPackages(stubs._MockModule))
    package.__version__ = importlib.import_module("sglang.version").__version__
    if package.__version__ != PINNED_VERSION:
        raise SGLangMissing(f"{SGLANG_DIR} holds sglang {package.__version__}, not {PINNED_VERSION}")
    return package
