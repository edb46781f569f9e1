"""What the trainer and the engines share about tensors on the wire: dtype names, the bucket's byte count,
the address towards a host, and the bare gloo/NCCL group vLLM's weight transfer uses on CPU.

SGLang's formats have their own modules: the serialised flattened bucket of the tensor mode
(`slime.sync.bucket_codec`) and the process group of the distributed mode (`slime.sync.weight_group`).

`WeightGroup` (vLLM's fake on CPU): the trainer's source rank is rank 0 and hosts a TCPStore on a fresh port;
worker i joins as `rank_offset + i`. It is a bare `ProcessGroupGloo` / `ProcessGroupNCCL` over
`PrefixStore(group_name, store)`, never registered with torch.distributed's world.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Sequence
from typing import Any

import torch

DTYPES = {
    name: getattr(torch, name)
    for name in ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    name = str(name).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; supported: {sorted(DTYPES)}")
    return DTYPES[name]


# ---------------------------------------------------------------------------- process group
def local_address_towards(host: str) -> str:
    """This machine's IP on the route to `host` (no packet is sent); 127.0.0.1 for a loopback host."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def create_store(address: str, port: int, world_size: int, *, is_master: bool, timeout_s: float):
    """The group's rendezvous; the master binds `port` (0: a free one, read back as `.port`)."""
    from torch.distributed import TCPStore

    return TCPStore(
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
        import torch.distributed as dist

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
        import torch.distributed as dist

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


# ---------------------------------------------------------------------------- flattened bucket
def bucket_nbytes(bucket: Sequence[tuple[str, torch.Tensor]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in bucket)


def unflatten(buffer: torch.Tensor, metadata: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Views of `buffer` as the named tensors (the caller copies them before the buffer goes away)."""
    out = {}
    for m in metadata:
        if not 0 <= m["start"] <= m["end"] <= buffer.numel():
            raise ValueError(
                f"tensor {m['name']!r}: bytes {m['start']}..{m['end']} outside the {buffer.numel()}-byte buffer"
            )
        out[m["name"]] = buffer[m["start"] : m["end"]].view(parse_dtype(m["dtype"])).reshape(m["shape"])
    return out
