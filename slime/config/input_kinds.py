"""What a string config field holds when it is more than text: a path, a URL, an address, a model checkpoint.

A field carries its kind as dataclass metadata (`field(default=None, metadata=HTTP_URL)`), so the checks of
addresses (slime.config.validate_addresses) and the hostile suite's coverage test find every such field by
walking the schema, new ones included.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from typing import Any

KIND = "input_kind"
PATH_READ = {KIND: "path_read"}  # must exist, unless the run makes it itself (a generator's file, a tiny model)
PATH_WRITTEN = {KIND: "path_written"}  # created and written by the run: must be creatable
MODEL_CHECKPOINT = {KIND: "model_checkpoint"}  # an HF model directory, checked against the model's fields
HTTP_URL = {KIND: "http_url"}  # http(s)://host[:port][/path]
HOST_PORT = {KIND: "host_port"}  # host:port, or an http(s) URL
RAY_ADDRESS = {KIND: "ray_address"}  # auto, local, host:port (the head's GCS) or ray://host:port
HOST = {KIND: "host"}  # a host name or IP address, no scheme, no port
ADDRESS_KINDS = ("http_url", "host_port", "ray_address", "host")


def _nested(annotation: Any) -> tuple[type | None, str]:
    """(the dataclass a field holds, "" for one or "[]" for a list of them), or (None, "")."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is list and args and dataclasses.is_dataclass(args[0]):
        return args[0], "[]"
    candidates = [annotation, *args]
    return next((c for c in candidates if isinstance(c, type) and dataclasses.is_dataclass(c)), None), ""


def typed_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, kind) of every kind-carrying field under the schema class `cls`; a list of configs is
    `key[]` (rollout.models[].model_path)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if KIND in f.metadata:
            yield prefix + f.name, f.metadata[KIND]
        inner, suffix = _nested(hints[f.name])
        if inner is not None:
            yield from typed_fields(inner, f"{prefix}{f.name}{suffix}.")


def typed_values(node: Any, prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """(dotted key, kind, value) of every kind-carrying field of the config object `node`; list entries are
    `key[i]`, and a list-valued field yields each element under its own `key[i]`."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if KIND in f.metadata and value is not None:
            items = enumerate(value) if isinstance(value, list) else [(None, value)]
            for i, item in items:
                yield (prefix + f.name + ("" if i is None else f"[{i}]")), f.metadata[KIND], item
        elif dataclasses.is_dataclass(value):
            yield from typed_values(value, f"{prefix}{f.name}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    yield from typed_values(item, f"{prefix}{f.name}[{i}].")
