"""The error vocabulary of validation: one `Problem` per offending key, all raised together as a `ConfigError`."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Iterator
from typing import Any

from slime.config.secret_keys import REDACTED, is_secret_key


@dataclasses.dataclass(frozen=True)
class Problem:
    """`key` (dotted config key) has `value`; `message` says what is wrong, `fix` the override that fixes it.

    `machine`: an input the launch needs is absent here, not a mistake in the config: a path that does not
    exist on this machine, too few local GPUs, prompt data or a reward not given yet. A launch refuses it like
    any problem; the dry run (debug=dry_run), which plans a launch elsewhere, lists it as still needed."""

    key: str
    value: Any
    message: str
    fix: str
    machine: bool = False

    def __str__(self) -> str:
        """`key=value: message. Fix: fix`; a credential's value is never echoed."""
        value = REDACTED if is_secret_key(self.key) and isinstance(self.value, str) else repr(self.value)
        return f"{self.key}={value}: {self.message}. Fix: {self.fix}"


def _rebuilt(cls: type[BaseException], args: tuple, state: dict[str, Any]) -> BaseException:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class PicklableFields:
    """Mixin for an exception with its own `__init__`: pickled as its class, message and fields, never re-run. A Ray
    actor's exception reaches the driver pickled, and one whose `__init__` takes other arguments than its message
    cannot be rebuilt the default way (Ray then reports `UnserializableException` instead of it)."""

    def __reduce__(self):
        return (_rebuilt, (type(self), self.args, dict(self.__dict__)))


class ConfigError(PicklableFields, ValueError):
    """One or more configuration problems, found before any resource was allocated."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid configuration ({len(problems)} problem{'s' * (len(problems) > 1)}):\n{lines}")


def one_of(key: str, value: Any, allowed: Iterable[Any]) -> Iterator[Problem]:
    """A problem when `value` is not in `allowed`, naming the nearest allowed values."""
    allowed = list(allowed)
    if value not in allowed:
        yield Problem(
            key,
            value,
            f"must be one of {allowed}{did_you_mean(str(value), map(str, allowed))}",
            f"set {key}=<one of {', '.join(map(str, allowed))}>",
        )


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """' (did you mean a, b?)' with the closest `choices` to `name`, or '' when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def get(cfg: Any, dotted: str) -> Any:
    """The value of a dotted key of a typed config."""
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def positive(cfg: Any, *keys: str) -> Iterator[Problem]:
    """A problem for each of `keys` whose value is set and <= 0."""
    for key in keys:
        value = get(cfg, key)
        if value is not None and value <= 0:
            yield Problem(key, value, "must be > 0", f"set {key} to a positive number")
