"""`WeightSync`: how a trainer's new weights reach the engines (REFERENCE.md §8).

One class per `rollout.weight_sync.mode`, registered in `slime.registry.WEIGHT_SYNC`. A sync object
lives on the trainer's source rank; the train backend feeds it the iterator of HF-named tensor buckets
it exports (`TrainBackend.export_weights`), and it talks to the engines through `EngineClient`s
(plain HTTP). No Ray inside: the runtime builds it from engine URLs and the config.

The protocol every mode follows (`push`): pause generation and flush the cache on every updatable
engine, transfer the buckets (the mode's own `_transfer`), then continue generation, so that no
request ever runs on half-updated weights; engines stamp the new `weight_version` on every later
response, and the rollout records it on each Sample. With `check_weight_update_equal`, every engine's
per-tensor sha256 (`GET /weights_checksum`) is compared with the trainer's exported tensors, cast to the
engine's dtype, before generation continues.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from slime.engine.client import EngineClient

if TYPE_CHECKING:  # torch: the driver imports SyncContext from here and never torch
    from slime.sync.hf_files import Bucket

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyncContext:
    """What every mode may use besides the engines."""

    source_checkpoint: str  # HF dir whose config and tokenizer files describe the model
    engine: str = "sglang"  # rollout.engine: which control client talks to the engines
    work_dir: str  # scratch space of this run (disk mode writes weight_v<N> dirs under it)
    bucket_bytes: int  # bucket size the exporter fills, in bytes
    keep: bool = False  # disk: keep each pushed directory
    check_weight_update_equal: bool = False  # debug: compare engine checksums with the trainer's after each push
    # tensor mode: per engine (in push order), the training rank colocated with each engine TP rank (-1: none)
    tp_trainer_ranks: tuple[tuple[int, ...], ...] = ()


class WeightMismatchError(RuntimeError):
    """An engine's weights differ from the trainer's after a sync (`debug.check_weight_update_equal`)."""


class WeightSync(abc.ABC):
    """Pushes weights into `engines` (every one of them receives each push)."""

    mode = "base"
    bracketed = True  # the buckets go between the engines' begin_weight_update and finish_weight_update

    def __init__(self, engines: Sequence[EngineClient], context: SyncContext):
        self.engines = list(engines)
        self.context = context

    def push(self, buckets: Iterable[Bucket], *, weight_version: int) -> dict[str, float]:
        """pause -> flush -> transfer -> continue on every engine; returns `perf/*` timings in seconds."""
        start = time.perf_counter()
        paused: list[EngineClient] = []
        try:
            for engine in self.engines:
                engine.pause_generation()
                paused.append(engine)
            for engine in self.engines:
                engine.flush_cache()
            expected: dict[str, dict[str, str]] = {}
            if self.context.check_weight_update_equal:
                buckets = self._hashing(buckets, expected)
            if self.bracketed:
                for engine in self.engines:
                    engine.begin_weight_update()
            transferred = self._transfer(buckets, weight_version=str(weight_version))
            if self.bracketed:
                for engine in self.engines:
                    engine.finish_weight_update(str(weight_version))
            if self.context.check_weight_update_equal:
                self.check_engines_equal(expected)
        except BaseException:
            self._continue(paused, raise_errors=False)  # the sync's own error is the one to report
            raise
        self._continue(paused, raise_errors=True)
        return {
            "perf/update_weights_time": time.perf_counter() - start,
            "perf/update_weights_bytes": float(transferred),
        }

    def _continue(self, engines: Sequence[EngineClient], *, raise_errors: bool) -> None:
        """Continue generation on every engine, even when one of them fails."""
        errors = []
        for engine in engines:
            try:
                engine.continue_generation()
            except Exception as exc:  # noqa: BLE001 - the others still continue
                logger.error("%s: continue_generation after a weight sync failed: %s", engine.url, exc)
                errors.append(exc)
        if errors and raise_errors:
            raise errors[0]

    @abc.abstractmethod
    def _transfer(self, buckets: Iterable[Bucket], *, weight_version: str) -> int:
        """Move every bucket into every engine and have them load it; returns the bytes moved."""

    def _hashing(self, buckets: Iterable[Bucket], expected: dict[str, dict[str, str]]) -> Iterator[Bucket]:
        """Pass the buckets through, recording per engine dtype each tensor's sha256 in that dtype."""
        from slime.sync.wire import parse_dtype, tensor_sha256

        dtypes = {str(e.server_info().get("dtype", "float32")) for e in self.engines}
        for bucket in buckets:
            for name, tensor in bucket:
                for dtype in dtypes:
                    expected.setdefault(dtype, {})[name] = tensor_sha256(tensor.to(parse_dtype(dtype)))
            yield bucket

    def check_engines_equal(self, expected: dict[str, dict[str, str]]) -> None:
        """Raise WeightMismatchError naming the engine and tensors whose bytes differ from `expected`."""
        for engine in self.engines:
            reply = engine.weights_checksum()
            want = expected.get(reply["dtype"], {})
            got = reply["checksums"]
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            differ = sorted(n for n in set(want) & set(got) if want[n] != got[n])
            if missing or extra or differ:
                raise WeightMismatchError(
                    f"{engine.url}: weights differ from the trainer's after the sync ({reply['dtype']}): "
                    f"{len(differ)} tensors differ {differ[:8]}, not in the engine {missing[:8]}, "
                    f"not exported by the trainer {extra[:8]}"
                )
        logger.info(
            "weights of %d engines equal the trainer's (%d tensors, sha256, version %s)",
            len(self.engines),
            len(next(iter(expected.values()), {})),
            self.engines and reply.get("weight_version"),
        )

    def close(self) -> None:
        """Release what the mode holds (directories, process groups)."""
