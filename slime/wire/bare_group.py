"""The bare gloo/NCCL weight-update group of vLLM's weight transfer on CPU (the fake's workers and the trainer).

The trainer's source rank is rank 0 and hosts a TCPStore on a fresh port; worker i joins as `rank_offset + i`.
It is a bare `ProcessGroupGloo` / `ProcessGroupNCCL` over `PrefixStore(group_name, store)`, never registered
with torch.distributed's world.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


def create_store(address: str, port: int, world_size: int, *, is_master: bool, timeout_s: float):
    """The group's rendezvous; the master binds `port` (0: a free one, read back as `.port`)."""
    return dist.TCPStore(
        address, port, world_size, is_master, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
    )


class WeightGroup:
    """A weight-update process group of `world_size` ranks; rank 0 (the trainer) broadcasts."""

    def __init__(
        self,
        store,
        *,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float,
        address: str,
        device: torch.device | None = None,
    ):
        self.rank, self.world_size, self.group_name, self.backend = rank, world_size, group_name, backend
        self.store = store  # kept alive: the master's store serves the other ranks' lookups
        prefixed = dist.PrefixStore(group_name, store)
        timeout = datetime.timedelta(seconds=timeout_s)
        if backend == "gloo":
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
            self.pg = dist.ProcessGroupGloo(prefixed, rank, world_size, options)
            self.device = torch.device("cpu")
        elif backend == "nccl":
            # callers may run collectives from worker threads, whose current CUDA device is 0
            self.device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
        else:
            raise ValueError(f"backend must be gloo or nccl, got {backend!r}")

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast `tensor` from rank 0 in place (receivers pass a buffer of the same shape and dtype)."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor], opts).wait()

    def close(self) -> None:
        for name in ("shutdown", "abort"):
            fn = getattr(self.pg, name, None)
            if fn is not None:
                try:
                    fn()
                    break
                except Exception:  # noqa: BLE001 - a peer that died already is fine here
                    continue
        self.pg = None
        self.store = None
