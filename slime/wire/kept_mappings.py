"""A reader's side of reused staging buffers: the buffers it opened, kept mapped for the next bucket.

A trainer that reuses its staging buffers (`slime.sync.staging`) sends every bucket through one of two buffers,
each shared once (`bucket_codec.share_once`): every item naming a buffer carries the same CUDA IPC handle,
reference counter and event. `KeptMappings.decode` opens such an item and holds the tensor, so that the next item
naming the same buffer reuses the open mapping (no `cudaIpcOpenMemHandle`, no close) and touches no counter:
torch's own cache hit (`rebuild_cuda_tensor`) would give back a counter for every item, and the trainer's one
counter would go below zero while the mapping is still open. On CPU a held buffer keeps its shared-memory segment
mapped, and torch's cache (`rebuild_storage_filename`, keyed by the segment's name) reuses it; each item there is
a share of its own, one reference taken back by the read.

The last `capacity` buffers (2: the trainer's two) are held; a newer one lets the oldest go, which closes its
mapping and gives the trainer's reference counter back, so a buffer the trainer replaced (a larger bucket, a new
sync object) is freed on the trainer by its next `torch.cuda.ipc_collect()`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import torch
from torch.multiprocessing import reductions

from slime.wire import bucket_codec

KEPT_BUFFERS = 2  # the trainer's staging buffers (slime.sync.staging.SLOTS)


class KeptMappings:
    """The reader's held buffers, newest last: {key: the flat uint8 tensor opened}. A CUDA buffer's key is its
    rebuild arguments (an item naming the same share of the same buffer has the same ones), a CPU buffer's its
    storage's address."""

    def __init__(self, capacity: int = KEPT_BUFFERS):
        self.capacity = capacity
        self.held: OrderedDict[Hashable, torch.Tensor] = OrderedDict()

    def decode(self, item: str | bytes) -> tuple[torch.Tensor, list[bucket_codec.FlattenedTensorMetadata]]:
        """`bucket_codec.decode(item)`, opening a buffer only where none of those held is the one it names;
        the buffer is held afterwards."""
        flat, metadata = bucket_codec.decode(item, rebuild_cuda=self._rebuild_cuda)
        if not flat.is_cuda:
            self._hold(("cpu", flat.untyped_storage().data_ptr()), flat)
        return flat, metadata

    def _rebuild_cuda(self, *args) -> torch.Tensor:
        key = bucket_codec.local_device_args(args)
        held = self.held.get(key)
        if held is not None:
            self.held.move_to_end(key)
            return held
        flat = reductions.rebuild_cuda_tensor(*key)
        self._hold(key, flat)
        return flat

    def _hold(self, key: Hashable, flat: torch.Tensor) -> None:
        self.held[key] = flat
        self.held.move_to_end(key)
        while len(self.held) > self.capacity:
            self.held.popitem(last=False)

    def release(self) -> None:
        """Let every held buffer go."""
        self.held.clear()
