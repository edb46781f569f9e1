"""Disk weight sync (REFERENCE.md §8.3): the trainer writes an HF dir, every engine reloads from it.

    <root>/weight_v000003/   safetensors + config, deleted after the engines loaded it unless `keep`
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import ray


class DiskWeightSync:
    """Pushes weights with version numbers that increase by one per push."""

    def __init__(self, root: str | Path, *, keep: bool = False):
        self.root = Path(root)
        self.keep = keep

    def push(self, train_group, rollout_manager, weight_version: int) -> float:
        """Write, load on every engine, clean up; return seconds taken."""
        start = time.perf_counter()
        path = self.root / f"weight_v{weight_version:06d}"
        train_group.save_hf(str(path))
        ray.get(rollout_manager.update_weights_from_disk.remote(str(path), weight_version))
        if not self.keep:
            shutil.rmtree(path, ignore_errors=True)
        return time.perf_counter() - start

    def close(self) -> None:
        """Remove the sync directory when nothing in it is kept."""
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
