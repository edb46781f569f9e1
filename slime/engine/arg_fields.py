"""What the SGLang and vLLM argument checks share: a version's field list (installed or pinned as JSON data),
the problem record, and the simple type check of a value against an annotation's text."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, NamedTuple

_SIMPLE_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


class ArgIssue(NamedTuple):
    """One problem with an engine argument key: the full config key, what is wrong, how to fix it."""

    key: str
    message: str
    fix: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class FieldList:
    """Argument names (-> annotation text, "" when unknown) of one engine version, and where they came from."""

    version: str
    source: str
    types: dict[str, str]


def pinned_fields(path: Path, version_key: str) -> FieldList:
    """The field list kept as data: {version_key: "x.y.z", "fields": {name: {"type": ...}}}."""
    data = json.loads(path.read_text())
    return FieldList(
        version=data[version_key],
        source=f"pinned list {path.name}",
        types={name: spec.get("type", "") for name, spec in data["fields"].items()},
    )


def type_ok(annotation: str, value: Any) -> bool:
    """Checks `T`, `T | None` and `Optional[T]` for the simple types; anything else is the engine's to check."""
    parts = [part.strip() for part in annotation.split("|")]
    if annotation.startswith("Optional[") and annotation.endswith("]"):
        parts = [annotation[len("Optional[") : -1], "None"]
    if value is None:
        return "None" in parts or not all(part in _SIMPLE_TYPES for part in parts)
    inner = [part for part in parts if part != "None"]
    if len(inner) != 1 or inner[0] not in _SIMPLE_TYPES:
        return True  # unions, literals, lists, config dataclasses: the engine checks them itself
    allowed = _SIMPLE_TYPES[inner[0]]
    if isinstance(value, bool) and bool not in allowed:
        return False
    return isinstance(value, allowed)
