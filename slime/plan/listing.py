"""The names every seam's registry holds, for `python main.py --help` (`${slime_registry:}` in conf/)."""

from __future__ import annotations

from omegaconf import OmegaConf

from slime.registry import ALL


def listing() -> str:
    """One line per seam: the config key and its registered names."""
    return "\n".join(f"  {r.key:<26} {', '.join(r.names())}" for r in ALL)


def register_listing_resolver() -> None:
    """Idempotent: `${slime_registry:}` in conf/ (the --help text) lists the registered names."""
    if not OmegaConf.has_resolver("slime_registry"):
        OmegaConf.register_new_resolver("slime_registry", listing)
