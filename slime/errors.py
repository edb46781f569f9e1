"""Exceptions that cross process boundaries whole: a Ray actor's exception reaches the driver pickled, and an
exception whose `__init__` takes other arguments than its message cannot be rebuilt the default way (Ray then
reports `UnserializableException` instead of it)."""

from __future__ import annotations

from typing import Any


def _rebuilt(cls: type[BaseException], args: tuple, state: dict[str, Any]) -> BaseException:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class PicklableFields:
    """Mixin for an exception with its own `__init__`: pickled as its class, message and fields, never re-run."""

    def __reduce__(self):
        return (_rebuilt, (type(self), self.args, dict(self.__dict__)))
