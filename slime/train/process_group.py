"""torch.distributed's default group of one trainer rank, shared by both backends.

Several ranks meet at rank 0's TCP store (`master_addr:master_port`). One rank meets nobody, so its group
stands on an in-process `HashStore` and binds no port: the port a caller picked a moment earlier
(`slime.net.free_port`) may be taken by another process before the store binds it, and a one-rank group
should not fail on that race.
"""

from __future__ import annotations

import datetime

import torch.distributed as dist

TIMEOUT = datetime.timedelta(minutes=30)


def init_default_group(*, device: str, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    """gloo on CPU, nccl on CUDA; a no-op when the group exists."""
    if dist.is_initialized():
        return
    backend = "nccl" if device == "cuda" else "gloo"
    if world_size == 1:
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=TIMEOUT)
        return
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=TIMEOUT,
    )
