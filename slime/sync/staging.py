"""Staging buffers reused for every bucket of every tensor-mode push (docs/engines.md#tensor-mode).

Only for engines whose record says they copy a bucket in before replying and keep the buffers they opened mapped
(`EngineFacts.reuses_tensor_buffers`; the engine side is `slime.wire.kept_mappings`): the trainer may then write
the next bucket into a buffer as soon as the engine replied, and every bucket names one of two CUDA IPC handles (or
shared-memory segments on CPU), which the engine opened once. Two, because the pipelined push packs bucket k+1 while
the engines load bucket k.

Each buffer is allocated by the first bucket that lands in it, as large as that bucket or the bucket size
(`min_bytes`, `rollout.weight_sync.bucket_mb`), whichever is larger, and replaced by one as large as a bucket that
does not fit: a bucket holds at least the bucket size and less than that plus its last tensor, so at most
2 x (bucket size + largest tensor) in all, after the first push usually none replaced. They stay
allocated between pushes (the memory plan counts them on a colocated GPU: slime.plan.memory) until `release`
(the sync's `close`). A buffer the engine still maps stays in the trainer's CUDA IPC limbo after its release, until
the engine lets it go (its next two buffers) and the trainer's next `torch.cuda.ipc_collect()`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from slime.wire import bucket_codec
from slime.wire.tensors import Bucket

SLOTS = 2  # one bucket being loaded, the next one being packed


def layout(bucket: Bucket) -> tuple[list, int, torch.device]:
    """(the bucket's metadata (`bucket_codec.bucket_metadata`), the bytes it packs into, the device it packs on: a
    tensor's CUDA device, else the CPU)."""
    metadata = bucket_codec.bucket_metadata(bucket)
    nbytes = metadata[-1].end_idx if metadata else 0
    return metadata, nbytes, next((t.device for _, t in bucket if t.is_cuda), torch.device("cpu"))


def fill(flat: torch.Tensor, bucket: Bucket, metadata: list) -> None:
    """Pack the bucket into `flat` (uint8) and wait for the copy: an engine reads the buffer once it is sent."""
    bucket_codec.flatten(bucket, flat, metadata)
    if flat.is_cuda:
        torch.cuda.current_stream(flat.device).synchronize()


@dataclasses.dataclass
class _Buffer:
    flat: torch.Tensor  # uint8, [capacity bytes], shared
    shared: Any  # bucket_codec.share_once(flat)


class StagingBuffers:
    """The trainer's reused staging buffers; `packed(bucket)` writes a bucket into a free one."""

    def __init__(self, min_bytes: int = 0) -> None:
        self.min_bytes = min_bytes  # bytes a buffer holds at least
        self.buffers: list[_Buffer | None] = [None] * SLOTS
        self.busy = [False] * SLOTS
        self.turn = 0  # the slot tried first: the one not used last

    @contextmanager
    def packed(self, bucket: Bucket) -> Iterator[Callable[[], str]]:
        """The bucket written into a free buffer (its copies done); yields a function returning a fresh item naming it
        (`bucket_codec.encode`). The buffer is free again on exit: the engines must have copied it out by then."""
        metadata, nbytes, device = layout(bucket)
        slot = self._take()
        try:
            buffer = self._fit(slot, nbytes, device)
            fill(buffer.flat, bucket, metadata)
            yield functools.partial(bucket_codec.encode, buffer.flat, metadata, shared=buffer.shared)
        finally:
            self.busy[slot] = False

    def _take(self) -> int:
        """A free slot, the one not used last first."""
        for slot in (self.turn, 1 - self.turn):
            if not self.busy[slot]:
                self.busy[slot], self.turn = True, 1 - slot
                return slot
        raise RuntimeError(f"all {SLOTS} staging buffers are in use: a bucket's load must end before a third is packed")

    def _fit(self, slot: int, nbytes: int, device: torch.device) -> _Buffer:
        """The slot's buffer, replaced by one of `nbytes` (at least `min_bytes`, and 1) where it is smaller or on
        another device."""
        buffer = self.buffers[slot]
        if buffer is None or buffer.flat.numel() < nbytes or buffer.flat.device != device:
            self.buffers[slot] = buffer = None  # the old one goes before the new one is allocated
            flat = torch.empty(max(nbytes, self.min_bytes, 1), dtype=torch.uint8, device=device)
            buffer = self.buffers[slot] = _Buffer(flat, bucket_codec.share_once(flat))
        return buffer

    def nbytes(self) -> int:
        """Bytes the buffers hold now."""
        return sum(b.flat.numel() for b in self.buffers if b is not None)

    def release(self) -> None:
        """Drop both buffers (a later bucket allocates again)."""
        if any(self.busy):
            raise RuntimeError("staging buffers released while a bucket is in them")
        self.buffers = [None] * SLOTS
