"""The weight-update process group of the distributed sync, joined the way SGLang joins it.

SGLang 0.5.23's engine joins with `init_custom_process_group(backend, init_method="tcp://addr:port",
world_size, rank, group_name)` (`sglang/srt/utils/common.py`, called by
`model_runner_components/weight_updater.py:init_weights_update_group` with rank = rank_offset + tp_rank):
torch's tcp rendezvous (rank 0 hosts the TCPStore), the store's timeout set, a `PrefixStore(group_name, store)`,
then torch's own `_new_process_group_helper` with no global ranks (it adds `<group_name>/` and `<device>/`
prefixes of its own), and the group's ranks registered as identity. The keys both sides wait on are only
the same when both sides take this path, so the trainer (rank 0) and the built-in engine take it too:
`host_store` + `group_from_store` on the trainer, `join` on an engine. Broadcasts are
`torch.distributed.broadcast(tensor, src=0, group=pg)`, as SGLang receives them.

The group lives in torch's process-group registry under its name (names are unique per process); `close`
destroys it.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch.distributed import rendezvous
from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world


def _timeout(timeout_s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=timeout_s)


def host_store(address: str, world_size: int, timeout_s: float) -> dist.TCPStore:
    """The rendezvous store rank 0 hosts, on a port the OS picks (read it back as `.port`); it does not wait
    for the other ranks (they connect when they join)."""
    return dist.TCPStore(address, 0, world_size, True, timeout=_timeout(timeout_s), wait_for_workers=False)


class CustomWeightGroup:
    """One rank of a weight-update group built on `store` (see the module docstring); rank 0 broadcasts."""

    def __init__(
        self,
        store,
        *,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float,
        device: torch.device | None = None,
    ):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
        if backend == "nccl":  # callers may build it in a worker thread, whose current CUDA device is 0
            self.device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.rank, self.world_size, self.group_name, self.backend = rank, world_size, group_name, backend
        self.store = store  # rank 0's store serves the other ranks' lookups for as long as the group lives
        store.set_timeout(_timeout(timeout_s))
        self.pg, _ = _new_process_group_helper(
            world_size,
            rank,
            [],
            Backend(backend),
            PrefixStore(group_name, store),
            group_name=group_name,
            backend_options=None,
            timeout=_timeout(timeout_s),
            device_id=None,
        )
        _world.pg_group_ranks[self.pg] = {i: i for i in range(world_size)}

    @classmethod
    def join(
        cls, address: str, port: int, *, rank: int, world_size: int, group_name: str, backend: str, timeout_s: float
    ) -> CustomWeightGroup:
        """Join as `rank` (>= 1) through torch's tcp rendezvous at `address:port`, as an SGLang engine does."""
        host = f"[{address}]" if ":" in address else address
        store, rank, world_size = next(
            rendezvous(f"tcp://{host}:{port}", rank, world_size, timeout=_timeout(timeout_s))
        )
        return cls(store, rank=rank, world_size=world_size, group_name=group_name, backend=backend, timeout_s=timeout_s)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast `tensor` from rank 0 in place (receivers pass a buffer of the same shape and dtype)."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.broadcast(tensor, src=0, group=self.pg)

    def close(self) -> None:
        """Destroy the group (a peer that is gone already is fine)."""
        pg, self.pg, self.store = self.pg, None, None
        if pg is None:
            return
        try:
            dist.destroy_process_group(pg)
        except Exception:  # noqa: BLE001 - a half-formed or aborted group still leaves the registry
            pass


class HostedWeightGroup:
    """Rank 0's end before the group forms: its store already listens (send `port` to the engines), and
    `join()` forms the group once they join (it blocks until every rank has)."""

    def __init__(self, *, address: str, world_size: int, group_name: str, backend: str, timeout_s: float):
        self.store = host_store(address, world_size, timeout_s)
        self.port = int(self.store.port)
        self.group_name = group_name
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
        self._group = dict(
            rank=0, world_size=world_size, group_name=group_name, backend=backend, timeout_s=timeout_s, device=device
        )

    def join(self) -> CustomWeightGroup:
        return CustomWeightGroup(self.store, **self._group)
