"""Colocated "tensor" weight sync (docs/engines.md#tensor-mode): buckets handed over in memory, on the same node.

Per bucket: flatten the bucket's tensors into one fresh byte buffer, shared memory on CPU or a CUDA buffer
on GPU, serialised as SGLang reads it (`slime.wire.bucket_codec`), then POST /update_weights_from_tensor
{serialized_named_tensors: [one per engine TP rank], load_format: "flattened_bucket"} to each engine in
turn. An engine copies into its parameters before replying; only then is the buffer freed, and a later
bucket gets a fresh one (reuse raced with the engine's asynchronous copy in SGLang). Engines whose record says they
finish the copy before replying and keep their mappings (`EngineFacts.reuses_tensor_buffers`) get two staging
buffers instead, kept across buckets and pushes (`slime.sync.staging`), and `keep_mapping: true` in each update.
While the engines load bucket k, the source packs bucket k+1 (so two buffers exist at once); with per-TP-rank
handles (below) the buckets go one at a time, since every rank joins each bucket's collectives in step. Each push reports its
packing and loading seconds (`perf/update_weights_pack_time`, `perf/update_weights_load_time`). Without
per-TP-rank handles the engines must run on the source rank's node.

Per-TP-rank handles: engine TP rank i opens the handle made on its own device. When
`SyncContext.tp_trainer_ranks` names, per engine, the training rank colocated with each TP rank, every
such rank stages the bucket on its own device too (`TensorHandleFollower`), the handles are gathered
to the source rank over the training group (`all_gather_object`), the source posts handle i to TP rank
i, and a barrier keeps every buffer alive until the engines replied. A TP rank without a colocated
trainer (-1) gets the source's handle.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, nullcontext

import torch
import torch.distributed as dist

from slime.engine.client import EngineClient
from slime.registry import ENGINES
from slime.sync import staging
from slime.sync.base import SyncContext, WeightSync
from slime.wire import bucket_codec
from slime.wire.tensors import Bucket, bucket_nbytes


@contextmanager
def packed(bucket: Bucket) -> Iterator[tuple[torch.Tensor, list]]:
    """The bucket flattened into a fresh uint8 buffer on its device: yields (buffer, metadata) and drops the
    buffer on exit. Not yet shared: a buffer shared and never read by an engine would outlive the sync (torch
    counts the reader's reference at sharing time)."""
    metadata, nbytes, device = staging.layout(bucket)
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    try:
        staging.fill(flat, bucket, metadata)
        yield flat, metadata
    finally:
        del flat


@contextmanager
def staged(bucket: Bucket) -> Iterator[str]:
    """The bucket packed and shared (a follower's own handle); yields its serialised item (SGLang's format) and
    drops the buffer on exit."""
    with packed(bucket) as (flat, metadata):
        yield bucket_codec.encode(flat, metadata)


def _per_rank(context: SyncContext) -> bool:
    return any(r > 0 for ranks in context.tp_trainer_ranks for r in ranks)


def _gather(item: str) -> list[str]:
    """Every training rank's handle item, by rank (collective over the training group)."""
    items: list = [None] * dist.get_world_size()
    dist.all_gather_object(items, item)
    return items


def _release_cuda_ipc() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()


class TPSizes:
    """Each engine's TP size (`/server_info`), asked once per engine URL: how many items a bucket is posted as."""

    def __init__(self):
        self.sizes: dict[str, int] = {}

    def of(self, engine: EngineClient) -> int:
        if engine.url not in self.sizes:
            self.sizes[engine.url] = int(engine.server_info().get("tp_size", 1) or 1)
        return self.sizes[engine.url]


class TensorWeightSync(WeightSync):
    """`rollout.weight_sync.mode=tensor`: shared-memory (CPU) or CUDA IPC (GPU) buckets, colocated engines."""

    mode = "tensor"
    pipelined = True  # pack bucket k+1 while the engines load bucket k (tools/bench_sync.py measures both)

    @classmethod
    def follower(cls, context: SyncContext, rank: int) -> TensorHandleFollower | None:
        """Per-TP-rank handles: every non-source training rank takes part in each push."""
        return TensorHandleFollower(context, rank) if _per_rank(context) else None

    def __init__(self, engines, context: SyncContext):
        super().__init__(engines, context)
        self.tp_sizes = TPSizes()
        reuse = ENGINES.facts(context.engine).reuses_tensor_buffers and not _per_rank(context)
        self.staging = (
            staging.StagingBuffers(context.bucket_bytes) if reuse else None
        )  # None: a fresh buffer per bucket

    def _transfer(self, buckets: Iterable[Bucket], *, weight_version: str) -> int:
        tp_sizes = [self.tp_sizes.of(engine) for engine in self.engines]
        self.phases = {"perf/update_weights_pack_time": 0.0, "perf/update_weights_load_time": 0.0}
        if _per_rank(self.context) or not self.pipelined:
            total = self._one_at_a_time(buckets, tp_sizes, weight_version)
        else:
            total = self._overlapped(buckets, tp_sizes, weight_version)
        _release_cuda_ipc()
        return total

    def _pack(self, bucket: Bucket, held: ExitStack) -> Callable[[], str]:
        """The bucket packed (its buffer kept by `held`), its packing time counted; returns the function that
        serialises an item of it (`bucket_codec.encode`)."""
        start = time.perf_counter()
        if self.staging is not None:
            source = held.enter_context(self.staging.packed(bucket))
        else:
            source = functools.partial(bucket_codec.encode, *held.enter_context(packed(bucket)))
        self.phases["perf/update_weights_pack_time"] += time.perf_counter() - start
        return source

    def _load(self, tp_sizes: list[int], source: Callable[[], str], weight_version: str) -> None:
        """Have every engine load the packed bucket (each replies once it copied) from items `source()` makes, its
        loading time counted; with per-TP-rank handles the followers' are gathered first. Each reader of the source's
        buffer gets an item of its own: a shared CPU buffer counts its readers per serialisation (torch's
        file_system sharing), so one item opened by a third reader finds the buffer gone."""
        start = time.perf_counter()
        keep = {"keep_mapping": True} if self.staging is not None else {}
        try:
            items = _gather(source()) if _per_rank(self.context) else None
            for index, engine in enumerate(self.engines):
                handles = self._handles(index, tp_sizes[index], source, items)
                engine.update_weights_from_tensor(handles, weight_version=weight_version, **keep)
        finally:
            del source  # an engine error's traceback keeps this frame: it must not keep the shared buffer alive
        self.phases["perf/update_weights_load_time"] += time.perf_counter() - start

    def _one_at_a_time(self, buckets: Iterable[Bucket], tp_sizes: list[int], weight_version: str) -> int:
        total = 0
        for bucket in buckets:
            with ExitStack() as held:
                self._load(tp_sizes, self._pack(bucket, held), weight_version)
                if _per_rank(self.context):
                    dist.barrier()  # the followers' buffers stay until every engine copied
            total += bucket_nbytes(bucket)
        return total

    def _overlapped(self, buckets: Iterable[Bucket], tp_sizes: list[int], weight_version: str) -> int:
        """One load in flight on a worker thread while the next bucket is packed; a bucket's buffer is freed once
        the engines replied (on an error, after the worker thread has stopped)."""
        total, previous = 0, None  # previous: (its load's future, the ExitStack holding its buffer)
        with ExitStack() as buffers, ThreadPoolExecutor(1, thread_name_prefix="tensor-sync") as loader:
            for bucket in buckets:
                held = buffers.enter_context(ExitStack())
                source = self._pack(bucket, held)
                if previous is not None:
                    previous[0].result()
                    previous[1].close()
                previous = (loader.submit(self._load, tp_sizes, source, weight_version), held)
                del source
                total += bucket_nbytes(bucket)
            if previous is not None:
                previous[0].result()
        return total

    def close(self) -> None:
        """Release the staging buffers (an engine that keeps their mappings gives them back with its next ones)."""
        if self.staging is not None:
            self.staging.release()
            _release_cuda_ipc()

    def _handles(self, index: int, tp_size: int, source: Callable[[], str], items: list[str] | None) -> list[str]:
        """One item per engine TP rank (SGLang's TP rank i reads item i): a colocated trainer rank's own, else a fresh
        item of the source's buffer (`source()`)."""
        ranks = self.context.tp_trainer_ranks[index] if index < len(self.context.tp_trainer_ranks) else ()
        if items is not None and ranks:
            return [items[r] if r >= 0 else source() for r in ranks]
        return [source() for _ in range(tp_size)]


class TensorHandleFollower:
    """A non-source training rank colocated with engine TP ranks: stages each bucket on its own device and
    joins the source's gather and barrier (see the module docstring). Pushes nothing itself."""

    def __init__(self, context: SyncContext, rank: int):
        self.context = context
        self.stages = any(rank in ranks for ranks in context.tp_trainer_ranks)  # else it only joins the collectives

    def follow(self, buckets: Iterable[Bucket]) -> None:
        for bucket in buckets:
            with staged(bucket) if self.stages else nullcontext(None) as item:
                _gather(item)
                dist.barrier()
        _release_cuda_ipc()

    def close(self) -> None:
        """Nothing held between pushes."""
