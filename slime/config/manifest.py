"""A checkpoint iteration's manifest: every file's size and sha256, written into the staged iteration before it is
published (slime/train/checkpoint_files.py `publish`) and verified before a run resumes from it
(slime/config/resume.py), so a truncated, missing or altered file is found before anything loads it.

    <root>/iter_0000007/manifest.json     {"files": {"model/model.safetensors": {"bytes": N, "sha256": "..."}, ...}}

An iteration saved without a manifest (before manifests were written) is trusted as its tracker names it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

MANIFEST = "manifest.json"
_CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(directory: Path) -> None:
    """`directory/manifest.json` over every file under `directory` (written, flushed and synced)."""
    files = {
        str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": sha256_of(p)} for p in _files(directory)
    }
    with (directory / MANIFEST).open("w") as out:
        json.dump({"files": files}, out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())


def torn_file(directory: Path) -> Optional[str]:
    """None when `directory` is whole (every file of its manifest there, with its size and checksum; no manifest:
    trusted); else what is wrong, naming the first bad file."""
    manifest = directory / MANIFEST
    if not manifest.exists():
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{manifest} is unreadable ({type(exc).__name__}: {exc})"
    for name, expected in sorted(files.items()):
        path = directory / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != expected["bytes"]:
            return f"{path} has {size:,} bytes, the manifest says {expected['bytes']:,} (truncated or rewritten)"
        if sha256_of(path) != expected["sha256"]:
            return f"{path} does not match its checksum in {manifest}"
    return None
