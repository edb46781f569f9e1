"""Registers the run's schema in Hydra's ConfigStore and the resolver conf/ uses for paths.

${slime_root:}       the project checkout (paths.root_dir)

The schema stored is `RunConfig` with every part's own options joined, which slime/run_schema.py builds from the
parts' specs, and `${slime_registry:}` (the --help listing of every registry) is registered by `slime.plan.listing`:
config imports no other slime package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def store_run_schema(schema: Any) -> None:
    """Store `schema` (the run's schema dataclass, or a config node) as `run_schema`, replacing the one stored, and
    add the `slime_root` resolver (once)."""
    ConfigStore.instance().store(name="run_schema", node=schema)
    if not OmegaConf.has_resolver("slime_root"):
        OmegaConf.register_new_resolver("slime_root", lambda: str(PROJECT_ROOT))
