"""An HF checkpoint's `config.json`, read as the checks and the tiny-model generator compare it (pure Python:
validation reads it before anything starts)."""

from __future__ import annotations

import json
from pathlib import Path


def read_hf_config(path: str | Path) -> dict:
    """`config.json` of an HF checkpoint, with `rope_theta` lifted out of transformers 5's `rope_parameters`."""
    fields = json.loads((Path(path) / "config.json").read_text())
    rope = fields.get("rope_parameters") or {}
    if "rope_theta" not in fields and "rope_theta" in rope:
        fields["rope_theta"] = rope["rope_theta"]
    return fields
