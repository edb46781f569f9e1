"""Registers the schemas in Hydra's ConfigStore and the resolvers conf/ uses.

${slime_root:}       the project checkout (paths.root_dir)
${slime_registry:}   the names of every registry in slime/registry.py (the --help text)
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from slime.config.schema import RunConfig

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _registry_listing() -> str:
    from slime.registry import listing

    return listing()


def register_configs() -> None:
    """Idempotent: store the run schema as `run_schema` and add the resolvers."""
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    if not OmegaConf.has_resolver("slime_root"):
        OmegaConf.register_new_resolver("slime_root", lambda: str(PROJECT_ROOT))
    if not OmegaConf.has_resolver("slime_registry"):
        OmegaConf.register_new_resolver("slime_registry", _registry_listing)
