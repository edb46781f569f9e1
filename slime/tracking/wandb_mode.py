"""wandb's mode for a run: online / offline / disabled, or auto (offline unless an API key is configured).

Pure Python (no wandb import): validation and the wandb run apply the same rule.
"""

from __future__ import annotations

import netrc
import os

from slime.config.schema import WandbConfig


def resolve_mode(cfg: WandbConfig) -> str:
    """auto -> WANDB_MODE if set, else online with an API key (env or ~/.netrc), else offline."""
    if cfg.mode != "auto":
        return cfg.mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if _has_api_key() else "offline"


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False
