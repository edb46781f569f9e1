"""A read-only typed config: `freeze(cfg)` makes every dataclass of the tree refuse assignment.

Each config dataclass instance becomes an instance of a read-only subclass of its own class: isinstance,
`dataclasses.fields`, `dataclasses.replace` (which gives a new read-only instance), equality with the
plain class, pickling (Ray) and deep copies all behave as for the plain class. Containers inside the
tree (lists, dicts) stay as they are; the dataclasses they hold are frozen too.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar

T = TypeVar("T")


def freeze(node: T) -> T:
    """`node` with every dataclass in it read-only (in place); returns `node`."""
    if isinstance(node, list | tuple):
        for item in node:
            freeze(item)
    elif isinstance(node, dict):
        for item in node.values():
            freeze(item)
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        for field in dataclasses.fields(node):
            freeze(getattr(node, field.name))
        if not is_frozen(node):
            object.__setattr__(node, "__class__", _read_only_class(type(node)))
    return node


def is_frozen(node: Any) -> bool:
    return getattr(type(node), "_slime_read_only", False)


def _refuse(self, name: str, value: Any = None) -> None:
    raise dataclasses.FrozenInstanceError(
        f"cannot assign {type(self).__qualname__}.{name}: the resolved config is read-only (slime.plan.resolve); "
        "build a changed copy with dataclasses.replace"
    )


def _frozen_again(node: Any) -> Any:
    """Unpickling: `node`, a plain instance just rebuilt, made read-only (its fields come read-only already)."""
    object.__setattr__(node, "__class__", _read_only_class(type(node)))
    return node


@functools.cache
def _read_only_class(cls: type) -> type:
    """The read-only subclass of the dataclass `cls` (one per class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # dataclasses.replace: a new read-only instance
        self.__dict__.update(vars(cls(*args, **kwargs)))

    def __eq__(self, other: Any) -> Any:  # equal to a plain instance with the same fields
        if not isinstance(other, cls):
            return NotImplemented
        fields = [f.name for f in dataclasses.fields(cls) if f.compare]
        return all(getattr(self, name) == getattr(other, name) for name in fields)

    def __reduce_ex__(self, protocol: int) -> tuple:  # pickled as a plain instance, as its class pickles one
        plain = object.__new__(cls)
        plain.__dict__.update(self.__dict__)
        return _frozen_again, (plain,)

    namespace = {
        "__init__": __init__,
        "__eq__": __eq__,
        "__hash__": cls.__hash__,
        "__reduce_ex__": __reduce_ex__,
        "__setattr__": _refuse,
        "__delattr__": _refuse,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "_slime_read_only": True,
    }
    return type(cls.__name__, (cls,), namespace)
