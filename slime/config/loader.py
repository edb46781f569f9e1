"""DictConfig (Hydra) -> typed RunConfig, once, on the driver."""

from __future__ import annotations

from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from slime.config.problems import ConfigError, Problem
from slime.config.schema import RunConfig


def to_run_config(dcfg: DictConfig) -> RunConfig:
    """Resolve every interpolation (`${hydra:...}` exists only here) and build the dataclasses.

    ConfigError naming each key left `???` (a size that `preset=none` leaves to the user) and how to set it."""
    missing = sorted(OmegaConf.missing_keys(dcfg))
    if missing:
        raise ConfigError([_missing_problem(key, preset_options()) for key in missing])
    dcfg = dcfg.copy()
    OmegaConf.resolve(dcfg)
    cfg = OmegaConf.to_object(dcfg)
    if not isinstance(cfg, RunConfig):
        raise TypeError(
            f"the composed config is a {type(cfg).__name__}, not RunConfig: is run_schema in the defaults list?"
        )
    return cfg


def preset_options() -> list[str]:
    """The options of conf/'s `preset` group, as the Hydra app that composed the config finds them (none when
    Hydra is not initialised, e.g. a config built in code)."""
    hydra = GlobalHydra.instance()
    return sorted(hydra.config_loader().get_group_options("preset")) if hydra.is_initialized() else []


def _missing_problem(key: str, presets: list[str]) -> Problem:
    fix = f"set it on the command line ({key}=<value>)"
    sizing = [p for p in presets if p != "none"]
    if sizing:
        fix += f", or choose a preset: preset=<{', '.join(sizing)}>"
    what = "is mandatory and nothing in the composed config sets it (a preset sizes the run; preset=none does not)"
    return Problem(key, "???", what, fix)


def to_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
