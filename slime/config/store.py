"""Registers the schemas in Hydra's ConfigStore and the resolver conf/ uses for paths.

${slime_root:}       the project checkout (paths.root_dir)

(`${slime_registry:}`, the --help listing of every registry, is registered by `slime.plan.listing`:
config imports no other slime package.)
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from slime.config.schema import RunConfig

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def register_configs() -> None:
    """Idempotent: store the run schema as `run_schema` and add the `slime_root` resolver."""
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    if not OmegaConf.has_resolver("slime_root"):
        OmegaConf.register_new_resolver("slime_root", lambda: str(PROJECT_ROOT))
