"""DictConfig (Hydra) -> typed RunConfig, once, on the driver."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from slime.config.schema import RunConfig


def to_run_config(dcfg: DictConfig) -> RunConfig:
    """Resolve every interpolation (`${hydra:...}` exists only here) and build the dataclasses."""
    dcfg = dcfg.copy()
    OmegaConf.resolve(dcfg)
    cfg = OmegaConf.to_object(dcfg)
    if not isinstance(cfg, RunConfig):
        raise TypeError(
            f"the composed config is a {type(cfg).__name__}, not RunConfig: is run_schema in the defaults list?"
        )
    return cfg


def to_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
