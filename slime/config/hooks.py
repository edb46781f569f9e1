"""The one way user code is loaded: an import path `module.attr` or a `_target_` node.

A `_target_` node becomes a partial with its other keys bound now; runtime arguments come at call
time. Every extension point (rollout function, reward, data generator, ...) goes through here.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable


def load_callable(spec: str | dict[str, Any], *, key: str = "hook") -> Callable[..., Any]:
    """Resolve `spec` to a callable; `key` names the config field in error messages."""
    if isinstance(spec, str):
        module_name, _, attr = spec.rpartition(".")
        if not module_name:
            raise ValueError(f"{key}={spec!r}: expected an import path like 'package.module.function'")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"{key}={spec!r}: cannot import module {module_name!r} ({exc})") from exc
        if not hasattr(module, attr):
            raise ValueError(f"{key}={spec!r}: module {module_name!r} has no attribute {attr!r}")
        return getattr(module, attr)
    if isinstance(spec, dict) and "_target_" in spec:
        target = load_callable(spec["_target_"], key=f"{key}._target_")
        kwargs = {k: v for k, v in spec.items() if not k.startswith("_")}
        return functools.partial(target, **kwargs)
    raise ValueError(f"{key}={spec!r}: expected an import path string or a node with _target_")
