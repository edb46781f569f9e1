"""Colocated "tensor" weight sync (REFERENCE.md §8.1): buckets handed over in memory, on the same node.

Per bucket: flatten the bucket's tensors into one fresh byte buffer, shared memory on CPU or a CUDA buffer
on GPU, serialised as SGLang reads it (`slime.wire.bucket_codec`), then POST /update_weights_from_tensor
{serialized_named_tensors: [one per engine TP rank], load_format: "flattened_bucket"} to each engine in
turn. An engine copies into its parameters before replying; only then is the buffer freed, and the next
bucket gets a fresh one (reuse raced with the engine's asynchronous copy in SGLang). The engines must run
on the source rank's node.

Per-TP-rank handles: engine TP rank i opens the handle made on its own device. When
`SyncContext.tp_trainer_ranks` names, per engine, the training rank colocated with each TP rank, every
such rank stages the bucket on its own device too (`TensorHandleFollower`), the handles are gathered
to the source rank over the training group (`all_gather_object`), the source posts handle i to TP rank
i, and a barrier keeps every buffer alive until the engines replied. A TP rank without a colocated
trainer (-1) gets the source's handle.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from slime.sync.base import SyncContext, WeightSync
from slime.wire import bucket_codec
from slime.wire.tensors import Bucket, bucket_nbytes


@contextmanager
def staged(bucket: Bucket) -> Iterator[str]:
    """The bucket flattened into a fresh buffer on its device; yields its serialised item (SGLang's format)
    and drops the buffer on exit."""
    metadata = bucket_codec.bucket_metadata(bucket)
    nbytes = metadata[-1].end_idx if metadata else 0
    device = next((t.device for _, t in bucket if t.is_cuda), torch.device("cpu"))
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    try:
        bucket_codec.flatten(bucket, flat, metadata)
        if flat.is_cuda:
            torch.cuda.current_stream(flat.device).synchronize()  # the copy lands before the engine reads
        yield bucket_codec.encode(flat, metadata)
    finally:
        del flat


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


class TensorWeightSync(WeightSync):
    """`rollout.weight_sync.mode=tensor`: shared-memory (CPU) or CUDA IPC (GPU) buckets, colocated engines."""

    mode = "tensor"

    @classmethod
    def follower(cls, context: SyncContext, rank: int) -> TensorHandleFollower | None:
        """Per-TP-rank handles: every non-source training rank takes part in each push."""
        return TensorHandleFollower(context, rank) if _per_rank(context) else None

    def _transfer(self, buckets: Iterable[Bucket], *, weight_version: str) -> int:
        total = 0
        per_rank = _per_rank(self.context)
        tp_sizes = [int(engine.server_info().get("tp_size", 1) or 1) for engine in self.engines]
        for bucket in buckets:
            with staged(bucket) as item:
                items = _gather(item) if per_rank else None
                for index, engine in enumerate(self.engines):
                    engine.update_weights_from_tensor(
                        self._handles(index, tp_sizes[index], item, items), weight_version=weight_version
                    )
                if per_rank:
                    dist.barrier()  # the followers' buffers stay until every engine copied
            total += bucket_nbytes(bucket)
        _release_cuda_ipc()
        return total

    def _handles(self, index: int, tp_size: int, item: str, items: list[str] | None) -> list[str]:
        """One item per engine TP rank (SGLang's TP rank i reads item i)."""
        ranks = self.context.tp_trainer_ranks[index] if index < len(self.context.tp_trainer_ranks) else ()
        if items is not None and ranks:
            return [items[r] if r >= 0 else item for r in ranks]
        return [item] * tp_size


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
