"""Typed configuration, the leaf every slime package may import: schemas, ConfigStore registration, the
loader, the problem vocabulary and the rules the schema alone decides. It imports no other slime package;
validation that walks the chosen parts' checks lives in slime/plan/validate.py."""

from slime.config.derived import Derived, fill_derived
from slime.config.loader import to_run_config, to_yaml
from slime.config.problems import ConfigError, Problem
from slime.config.schema import RunConfig
from slime.config.store import store_run_schema

__all__ = [
    "ConfigError",
    "Derived",
    "Problem",
    "RunConfig",
    "fill_derived",
    "store_run_schema",
    "to_run_config",
    "to_yaml",
]
