"""`WeightSync`: how a trainer's new weights reach the engines (REFERENCE.md §8).

One class per `rollout.weight_sync.mode`, registered in `slime.registry.WEIGHT_SYNC`. A sync object
lives on the trainer's source rank; the train backend feeds it the iterator of HF-named tensor buckets
it exports (`TrainBackend.export_weights`), and it talks to the engines through `EngineClient`s
(plain HTTP). No Ray inside: the runtime builds it from engine URLs and the config.

The protocol every mode follows (`push`): pause generation and flush the cache on every updatable
engine, transfer the buckets (the mode's own `_transfer`), then continue generation, so that no
request ever runs on half-updated weights; engines stamp the new `weight_version` on every later
response, and the rollout records it on each Sample.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from typing import TYPE_CHECKING, Iterable, Sequence

from slime.engine.client import EngineClient

if TYPE_CHECKING:  # torch: the driver imports SyncContext from here and never torch
    from slime.sync.hf_files import Bucket


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyncContext:
    """What every mode may use besides the engines."""

    source_checkpoint: str  # HF dir whose config and tokenizer files describe the model
    work_dir: str  # scratch space of this run (disk mode writes weight_v<N> dirs under it)
    bucket_bytes: int  # bucket size the exporter fills, in bytes
    keep: bool = False  # disk: keep each pushed directory


class WeightSync(abc.ABC):
    """Pushes weights into `engines` (every one of them receives each push)."""

    mode = "base"

    def __init__(self, engines: Sequence[EngineClient], context: SyncContext):
        self.engines = list(engines)
        self.context = context

    def push(self, buckets: Iterable[Bucket], *, weight_version: int) -> dict[str, float]:
        """pause -> flush -> transfer -> continue on every engine; returns `perf/*` timings in seconds."""
        start = time.perf_counter()
        for engine in self.engines:
            engine.pause_generation()
        try:
            for engine in self.engines:
                engine.flush_cache()
            transferred = self._transfer(buckets, weight_version=str(weight_version))
        finally:
            for engine in self.engines:
                engine.continue_generation()
        return {"perf/update_weights_time": time.perf_counter() - start, "perf/update_weights_bytes": float(transferred)}

    @abc.abstractmethod
    def _transfer(self, buckets: Iterable[Bucket], *, weight_version: str) -> int:
        """Move every bucket into every engine and have them load it; returns the bytes moved."""

    def close(self) -> None:
        """Release what the mode holds (directories, process groups)."""
