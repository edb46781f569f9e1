"""What crosses from the trainer to an engine in the tensor and distributed modes; both sides import it.

Weight-update process group (distributed mode, REFERENCE.md §8.2): the trainer's source rank is rank 0
and hosts a TCPStore on a fresh port; engine TP rank i of engine e joins as `rank_offset + i`. The group
is a bare `ProcessGroupGloo` / `ProcessGroupNCCL` object, never registered with torch.distributed's
world, so the trainer's own default group (and an engine's, if it has one) is left untouched; this is
what SGLang's `init_custom_process_group` achieves through c10d internals.

Flattened bucket (tensor mode, §8.1): the bucket's tensors are concatenated as bytes into one fresh
uint8 buffer; metadata per tensor is (name, dtype, shape, start, end) in bytes. The buffer travels as a
handle: a file under /dev/shm on CPU (the engine maps and copies it, the producer deletes it after the
engine's reply) or a CUDA IPC handle (`torch.multiprocessing.reductions.reduce_tensor`) on GPU. The
request item is base64 of a pickle of `{"handle": ..., "metadata": [...]}`, as SGLang's
`serialized_named_tensors`.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
import pickle
import socket
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

DTYPES = {
    name: getattr(torch, name)
    for name in ("float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
}
SHM_DIR = "/dev/shm"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    name = str(name).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; supported: {sorted(DTYPES)}")
    return DTYPES[name]


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 of the tensor's bytes (row-major, its own dtype, on CPU)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


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
def flatten_into(bucket: Sequence[tuple[str, torch.Tensor]], buffer: torch.Tensor) -> list[dict[str, Any]]:
    """Copy the bucket's tensors as bytes into the uint8 `buffer` (sized by `bucket_nbytes`); returns metadata."""
    metadata, offset = [], 0
    for name, tensor in bucket:
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        end = offset + flat.numel()
        buffer[offset:end].copy_(flat)
        metadata.append(
            {"name": name, "dtype": dtype_name(tensor.dtype), "shape": list(tensor.shape), "start": offset, "end": end}
        )
        offset = end
    return metadata


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


def new_shm_buffer(nbytes: int) -> tuple[torch.Tensor, str]:
    """A fresh uint8 tensor of `nbytes` backed by a new file under /dev/shm; returns (tensor, path)."""
    path = os.path.join(SHM_DIR, f"slime-weights-{os.getpid()}-{uuid.uuid4().hex}.bin")
    with open(path, "wb") as f:
        f.truncate(max(1, nbytes))
    return torch.from_file(path, shared=True, size=max(1, nbytes), dtype=torch.uint8)[:nbytes], path


def make_handle(buffer: torch.Tensor, shm_path: str | None) -> dict[str, Any]:
    if buffer.is_cuda:
        from torch.multiprocessing.reductions import reduce_tensor

        uuid = str(torch.cuda.get_device_properties(buffer.device).uuid)  # how vLLM's IPC receiver finds its handle
        return {"kind": "cuda_ipc", "rebuild": reduce_tensor(buffer), "device_uuid": uuid}
    return {"kind": "shm_file", "path": shm_path, "nbytes": buffer.numel()}


def open_handle(handle: dict[str, Any]) -> torch.Tensor:
    """The producer's uint8 buffer, mapped into this process (read it before replying)."""
    if handle.get("kind") == "shm_file":
        path, nbytes = handle["path"], int(handle["nbytes"])
        if not Path(path).is_file():
            raise ValueError(f"shared-memory file {path!r} does not exist here (is the engine on the trainer's node?)")
        return torch.from_file(path, shared=False, size=max(1, nbytes), dtype=torch.uint8)[:nbytes]
    if handle.get("kind") == "cuda_ipc":
        rebuild, args = handle["rebuild"]
        return rebuild(*args)
    raise ValueError(f"unknown bucket handle kind {handle.get('kind')!r} (shm_file | cuda_ipc)")


def encode(obj: Any) -> str:
    return base64.b64encode(pickle.dumps(obj)).decode("ascii")


def decode(text: str) -> Any:
    # pickle from the trainer of the same run, as SGLang's MultiprocessingSerializer; never from users
    return pickle.loads(base64.b64decode(text))
