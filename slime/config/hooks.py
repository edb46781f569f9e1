"""The one way user code is loaded: an import path `module.attr` or a `_target_` node.

A `_target_` node becomes a partial with its other keys bound now; runtime arguments come at call
time. Every extension point (rollout function, reward, filter, data generator, ...) goes through here,
and validation calls it with the extension point's call shape, so a typo or a wrong signature stops the
run before anything starts rather than in the middle of it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from typing import Any, Optional

from slime.config.install import install_fix
from slime.config.problems import PicklableFields, Problem, did_you_mean


class HookError(PicklableFields, ValueError):
    """A hook that cannot be loaded or cannot be called the way its extension point calls it.

    `key` is the offending config key (a node's own key for a bad node entry), `value` its value; `missing` the
    module a dependency of the hook's module imports and this machine lacks (None: the hook itself is wrong).
    """

    def __init__(self, key: str, value: Any, message: str, *, missing: Optional[str] = None):
        self.key, self.value, self.message, self.missing = key, value, message, missing
        super().__init__(f"{key}={value!r}: {message}")

    def problem(self, fix: str) -> Problem:
        """Validation's Problem: `fix` for a wrong hook; for a missing dependency, its install command (a machine
        problem: the dry run, which plans a launch elsewhere, lists it as still needed)."""
        if self.missing is None:
            return Problem(self.key, self.value, self.message, fix)
        return Problem(self.key, self.value, self.message, install_fix(self.missing), machine=True)


def load_callable(
    spec: str | dict[str, Any],
    *,
    key: str = "hook",
    signature: Optional[tuple[str, ...]] = None,
    keywords: tuple[str, ...] = (),
    may_be_async: bool = True,
) -> Callable[..., Any]:
    """Resolve `spec` to a callable; `key` names the config field in error messages.

    With `signature`, also check the call shape: the callable must accept the positional arguments
    named in `signature` plus the keyword arguments `keywords` (`inspect.Signature.bind`), and must not
    be a coroutine function unless `may_be_async`. Raises HookError (a ValueError) saying what is wrong.
    """
    if isinstance(spec, str):
        fn = _import_attr(spec, key)
    elif isinstance(spec, dict) and "_target_" in spec:
        target = _import_attr(spec["_target_"], f"{key}._target_") if isinstance(spec["_target_"], str) else None
        if target is None:
            raise HookError(
                f"{key}._target_", spec["_target_"], "expected an import path like 'package.module.function'"
            )
        kwargs = {k: v for k, v in spec.items() if not k.startswith("_")}
        _check_node_keys(target, kwargs, key)
        fn = functools.partial(target, **kwargs)
    else:
        raise HookError(key, spec, "expected an import path string or a node with _target_")
    if not callable(fn):
        raise HookError(key, spec, f"{type(fn).__name__} object is not callable")
    if signature is not None:
        check_call_shape(fn, key=key, spec=spec, signature=signature, keywords=keywords, may_be_async=may_be_async)
    return fn


def call_shape(signature: tuple[str, ...], keywords: tuple[str, ...]) -> str:
    """'fn(ctx, rollout_id, evaluation=...)' for messages."""
    return f"fn({', '.join([*signature, *(f'{k}=...' for k in keywords)])})"


def check_call_shape(
    fn: Callable[..., Any],
    *,
    key: str,
    spec: Any,
    signature: tuple[str, ...],
    keywords: tuple[str, ...] = (),
    may_be_async: bool = True,
) -> None:
    """HookError unless `fn(*signature, **keywords)` binds (and fn is sync when `may_be_async` is false)."""
    shape = call_shape(signature, keywords)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without introspectable signatures: nothing to check against
    try:
        sig.bind(*signature, **{k: None for k in keywords})
    except TypeError as exc:
        raise HookError(key, _name(spec), f"its signature {sig} cannot be called as {shape} ({exc})") from None
    if not may_be_async and inspect.iscoroutinefunction(fn):
        raise HookError(
            key,
            _name(spec),
            f"a coroutine function (async def); it is called as {shape} and its result "
            "used directly, so it must be a plain def",
        )


def _name(spec: Any) -> Any:
    return spec.get("_target_", spec) if isinstance(spec, dict) else spec


def _import_attr(path: str, key: str) -> Any:
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise HookError(key, path, "expected an import path like 'package.module.function'")
    module = _import_module(module_name, path, key)
    if not hasattr(module, attr):
        public = [n for n in dir(module) if not n.startswith("_")]
        raise HookError(key, path, f"module {module_name!r} has no attribute {attr!r}{did_you_mean(attr, public)}")
    return getattr(module, attr)


def _import_module(module_name: str, path: str, key: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name != exc.name and not module_name.startswith(exc.name + "."):
            raise HookError(
                key,
                path,
                f"importing {module_name!r} failed: it imports {exc.name!r}, which is not installed",
                missing=exc.name,
            ) from None
        raise HookError(key, path, f"no module named {exc.name!r}{_nearest_module(exc.name or module_name)}") from None
    except Exception as exc:  # the user's module raised while importing: report it as the hook's problem
        raise HookError(key, path, f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from None


def _nearest_module(missing: str) -> str:
    """' (did you mean pkg.x?)' from the modules of the missing module's parent package."""
    parent = missing.rpartition(".")[0]
    if not parent:
        return ""
    try:
        package = importlib.import_module(parent)
    except Exception:  # the parent is missing too: nothing closer to offer
        return ""
    return did_you_mean(missing, [f"{parent}.{m.name}" for m in pkgutil.iter_modules(getattr(package, "__path__", []))])


def _check_node_keys(target: Callable[..., Any], kwargs: dict[str, Any], key: str) -> None:
    """Every key of a `_target_` node must be a parameter of the target (nearest names on a typo)."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    for name in kwargs:
        if name not in params:
            raise HookError(
                f"{key}.{name}",
                kwargs[name],
                f"{target.__module__}.{target.__qualname__} has no parameter "
                f"{name!r}{did_you_mean(name, params)}; its parameters: {', '.join(params)}",
            )
