"""Registers the schemas in Hydra's ConfigStore and the `${slime_root:}` resolver."""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from slime.config.schema import RunConfig

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def register_configs() -> None:
    """Idempotent: store the run schema as `run_schema` and add the project-root resolver."""
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    if not OmegaConf.has_resolver("slime_root"):
        OmegaConf.register_new_resolver("slime_root", lambda: str(PROJECT_ROOT))
