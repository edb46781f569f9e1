"""The run's schema: slime.config's `RunConfig` with each part's own options joined in.

A part's spec (`slime.registry.Spec.config`) names the dataclass of its options, declared beside the part; its
fields join the config node that holds the part's seam key: the built-in engine's `hf: HFEngineConfig` joins
`rollout` (the node of `rollout.engine`), so `rollout.hf` is typed as the engine declares it and adding a part with
options edits no schema in slime/config, which names no part. The joined schema is, for each node on the way, a
dataclass subclass of the node's own class (its name, every field of the base in place, the parts' fields after
them): Hydra validates a typo or a wrongly typed value under a part's section at compose time as anywhere else,
`OmegaConf.to_object` gives the part's dataclass, and `dataclasses.replace`, copies and pickles keep the class.

Every part of the project joins; a part outside it (a seam's value naming a package with a spec.py) joins where a
config chooses it (`outside_specs`, read by main.py's front door before it composes the run).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterable
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slime.config import RunConfig, store_run_schema
from slime.registry import ALL, Spec, specs

# (dotted path of a node under the class, "" for the class itself; the dataclass whose fields join that node)
Joins = tuple[tuple[str, type], ...]


def run_schema(outside: Iterable[Spec] = ()) -> type:
    """`RunConfig` with the options of every part of the project, and of the `outside` records, joined; ValueError
    when two of them declare the same key."""
    return joined(RunConfig, joins([*specs(), *outside]))


def register_configs(outside: Iterable[Spec] = ()) -> None:
    """Store `run_schema(outside)` as Hydra's `run_schema`, replacing the one stored."""
    store_run_schema(run_schema(outside))


def schema_class(path: str) -> type:
    """The class of the node at dotted `path` in the project's run schema (`schema_class("rollout")`: RolloutConfig
    with every engine's options), to build a node in code as a composed config holds it."""
    cls = run_schema()
    for name in path.split("."):
        cls = _node_class(typing.get_type_hints(cls)[name])
    return cls


def seam_keys() -> tuple[str, ...]:
    """The config keys that choose a part (`rollout.engine`, ...), each naming one a registered name or a package."""
    return tuple(registry.key for registry in ALL)


def outside_specs(tree: DictConfig) -> tuple[Spec, ...]:
    """The records of the parts outside the project that the composed config `tree` chooses (a seam's value naming a
    package, `rollout.engine=my_engines.fast`) and that declare options; a value that names none is left to
    validation, which says why."""
    found = []
    for registry in ALL:
        try:
            value = OmegaConf.select(tree, registry.key, default=None, throw_on_missing=False)
        except OmegaConfBaseException:  # an interpolation that does not resolve yet: validation reports it
            continue
        if not isinstance(value, str) or value in registry.names():
            continue
        try:
            spec = registry.spec(value)
        except ValueError:
            continue
        if spec.config is not None:
            found.append(spec)
    return tuple(found)


def joins(records: Iterable[Spec]) -> Joins:
    """(node path, options class) of each record that declares options, the node being the one that holds its seam
    key; in a stable order, each once."""
    found = {(spec.seam.rpartition(".")[0], spec.config) for spec in records if spec.config is not None}
    return tuple(sorted(found, key=lambda join: (join[0], join[1].__module__, join[1].__qualname__)))


@functools.cache
def joined(base: type, joins: Joins) -> type:
    """The dataclass `base` with the fields of each joined class added at its node (one class per `base` and
    `joins`, so that equal schemas are one class)."""
    hints = typing.get_type_hints(base)
    fields: list[tuple[str, Any, dataclasses.Field]] = []
    for name, below in _by_child(joins).items():
        if name not in hints:
            raise ValueError(f"{base.__name__} has no node {name!r} for a part's options to join")
        fields.append(_child_field(base, name, hints[name], joined(_node_class(hints[name]), below)))
    owner = {name: base.__name__ for name in hints}
    for path, options in joins:
        if path:
            continue
        option_hints = typing.get_type_hints(options)
        for f in dataclasses.fields(options):
            if f.name in owner:
                raise ValueError(
                    f"{options.__module__}.{options.__qualname__} declares {f.name!r}, which {owner[f.name]} has"
                )
            owner[f.name] = f"{options.__module__}.{options.__qualname__}"
            fields.append((f.name, option_hints[f.name], _copied(f)))
    if not fields:
        return base
    cls = dataclasses.make_dataclass(
        base.__name__, fields, bases=(base,), kw_only=True, namespace={"__reduce_ex__": _reducer(base, joins)}
    )
    cls.__module__, cls.__qualname__ = base.__module__, base.__qualname__  # messages name the schema's class
    return cls


def _by_child(joins: Joins) -> dict[str, Joins]:
    """The joins below `base`'s own fields, by the field they are under, their paths made relative to it."""
    below: dict[str, list[tuple[str, type]]] = {}
    for path, options in joins:
        if path:
            head, _, rest = path.partition(".")
            below.setdefault(head, []).append((rest, options))
    return {name: tuple(items) for name, items in below.items()}


def _node_class(hint: Any) -> type:
    """The dataclass a field's type holds (`RolloutConfig`, or the X of `Optional[X]`)."""
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


def _child_field(base: type, name: str, hint: Any, cls: type) -> tuple[str, Any, dataclasses.Field]:
    """`base`'s field `name` holding the joined class `cls` instead of its own, with the same default."""
    old = next(f for f in dataclasses.fields(base) if f.name == name)
    kind = Optional[cls] if _node_class(hint) is not hint else cls
    if old.default_factory is not dataclasses.MISSING:
        return name, kind, dataclasses.field(default_factory=cls, metadata=old.metadata, kw_only=True)
    return name, kind, _copied(old)


def _copied(f: dataclasses.Field) -> dataclasses.Field:
    """A new, unbound field declared as `f` is (a Field belongs to one class)."""
    default = {} if f.default is dataclasses.MISSING else {"default": f.default}
    if f.default_factory is not dataclasses.MISSING:
        default = {"default_factory": f.default_factory}
    return dataclasses.field(init=f.init, repr=f.repr, compare=f.compare, metadata=f.metadata, kw_only=True, **default)


def _reducer(base: type, joins: Joins):
    """A joined class's `__reduce_ex__`: pickled as its base and joins, whose classes pickle can find by name."""

    def __reduce_ex__(self, protocol: int) -> tuple:
        return _restored, (base, joins, dict(self.__dict__))

    return __reduce_ex__


def _restored(base: type, joins: Joins, state: dict[str, Any]) -> Any:
    """Unpickling: an instance of `joined(base, joins)` holding `state`."""
    node = object.__new__(joined(base, joins))
    node.__dict__.update(state)
    return node
