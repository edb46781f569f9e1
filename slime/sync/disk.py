"""Disk weight sync (docs/engines.md#disk-mode): HF safetensors in a directory, every engine reloads from it.

    <work_dir>/weights/weight_v000003/   safetensors + index + config, deleted after the engines
                                         loaded it unless `rollout.weight_sync.keep`

The directory must be visible to every engine's node (a shared filesystem on multi-node clusters).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from slime.sync.base import WeightSync
from slime.wire.hf_dir import write_hf_dir
from slime.wire.tensors import Bucket


class DiskWeightSync(WeightSync):
    """`rollout.weight_sync.mode=disk`: write an HF directory, every engine reloads it."""

    mode = "disk"
    bracketed = False  # a reload from disk is one call per engine

    @property
    def root(self) -> Path:
        return Path(self.context.work_dir) / "weights"

    def _transfer(self, buckets: Iterable[Bucket], *, weight_version: str) -> int:
        path = self.root / f"weight_v{int(weight_version):06d}"
        written = write_hf_dir(buckets, path, source_checkpoint=self.context.source_checkpoint)
        try:
            for client_class in dict.fromkeys(type(engine) for engine in self.engines):
                client_class.prepare_disk_checkpoint(str(path))
            for engine in self.engines:
                engine.update_weights_from_disk(
                    str(path), weight_version=weight_version, flush_cache=not self.keeps_requests
                )
        finally:
            if not self.context.keep:
                shutil.rmtree(path, ignore_errors=True)
        return written

    def close(self) -> None:
        if not self.context.keep:
            shutil.rmtree(self.root, ignore_errors=True)
