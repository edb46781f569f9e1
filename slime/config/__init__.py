"""Typed configuration: schemas, ConfigStore registration, validation and derived values."""

from slime.config.derive import Derived, derive, fill_derived
from slime.config.loader import to_run_config, to_yaml
from slime.config.problems import ConfigError, Problem
from slime.config.schema import RunConfig
from slime.config.store import register_configs
from slime.config.validate import validate

__all__ = [
    "ConfigError",
    "Derived",
    "Problem",
    "RunConfig",
    "derive",
    "fill_derived",
    "register_configs",
    "to_run_config",
    "to_yaml",
    "validate",
]
