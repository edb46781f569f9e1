"""The trainer's side of vLLM's weight transfer (it needs torch: only the trainer's process loads it).

- Distributed mode with vLLM servers on GPU: vLLM's workers join the group that `/init_weight_transfer_engine
  {"init_info": {master_address, master_port, rank_offset, world_size}}` names through vLLM's own rendezvous
  (`StatelessProcessGroup` hosted by rank 0 on `master_port`, then a `PyNcclCommunicator`), not through
  torch.distributed's store protocol, so the trainer must open its end with vLLM's trainer API:
  `vllm.distributed.weight_transfer.nccl_common.trainer_init`. Each tensor of an `/update_weights` call
  (packed=False) is then one broadcast from rank 0, in the listed order. This needs vllm importable in the
  trainer's process (the GPU image); the CPU tests' fake speaks gloo instead (`slime.wire.bare_group`).
- Tensor mode: `ipc_update_info`, vLLM's packed IPC `update_info` of one flattened bucket.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Sequence
from typing import Any

import torch

from slime.net import free_port
from slime.wire import bare_group, bucket_codec

WEIGHT_GROUP_PREFIX = "vllm-weight-transfer"  # the store prefix of a gloo group (the CPU tests' fake joins it)


class VLLMNCCLGroup:
    """Rank 0 of a vLLM weight-transfer group; `broadcast(tensor)` sends one tensor to every worker."""

    def __init__(self, *, address: str, port: int, world_size: int):
        # optional library: vllm (the trainer's process on the GPU image; the CPU tests stand it in)
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        self.comm = trainer_init({"master_address": address, "master_port": port, "world_size": world_size}, rank=0)
        self.device = torch.device(self.comm.device)
        self.world_size = world_size

    def broadcast(self, tensor: torch.Tensor) -> None:
        stream = torch.cuda.current_stream() if tensor.is_cuda else None
        self.comm.broadcast(tensor, src=0, stream=stream)

    def close(self) -> None:
        """Destroy the communicator (`PyNcclCommunicator.destroy`, vllm/distributed/device_communicators/pynccl.py)."""
        comm, self.comm = self.comm, None
        if comm is not None:
            comm.destroy()


class VLLMTrainerEnd:
    """Rank 0's end before the group forms: `port` to send in `init_info`, `join()` once the workers join."""

    def __init__(self, *, address: str, world_size: int, backend: str, timeout_s: float):
        self.address, self.world_size, self.backend, self.timeout_s = address, world_size, backend, timeout_s
        self.store = None
        if backend == "nccl":
            self.port = free_port(address)  # vLLM's StatelessProcessGroup binds it itself
        else:
            self.store = bare_group.create_store(address, 0, world_size, is_master=True, timeout_s=timeout_s)
            self.port = int(self.store.port)

    def join(self):
        if self.store is None:
            return VLLMNCCLGroup(address=self.address, port=self.port, world_size=self.world_size)
        return bare_group.WeightGroup(
            self.store,
            rank=0,
            world_size=self.world_size,
            group_name=WEIGHT_GROUP_PREFIX,
            backend=self.backend,
            timeout_s=self.timeout_s,
            address=self.address,
        )


def ipc_update_info(items: Sequence[str]) -> dict[str, Any]:
    """vLLM's packed IPC `update_info` for one flattened bucket given as SGLang-format items
    (`slime.wire.bucket_codec`, one per engine TP rank): names, dtype_names, shapes, tensor_sizes (bytes, in
    buffer order) and `ipc_handles_pickled`, base64 of a pickled {device key: rebuild args} (the GPU's UUID
    for CUDA IPC, with torch's device index of this process; "cpu" for a shared-memory segment:
    (path, byte offset of the data, bytes))."""
    handles: dict[str, Any] = {}
    metadata = None
    for item in items:
        rebuild, meta = bucket_codec.describe(item)
        if metadata is not None and meta != metadata:
            raise ValueError("the TP ranks' buckets hold different tensors")
        metadata = meta
        if rebuild.function == "rebuild_cuda_tensor":
            uuid, args = bucket_codec.cuda_rebuild_args(rebuild)
            handles[uuid] = args
        else:
            handles["cpu"] = bucket_codec.shm_segment(rebuild)
    metadata = metadata or []
    if [m.start_idx for m in metadata] != [0, *(m.end_idx for m in metadata[:-1])]:
        raise ValueError("a packed bucket must hold its tensors back to back (one dtype per bucket)")
    return {
        "names": [m.name for m in metadata],
        "dtype_names": [str(m.dtype).removeprefix("torch.") for m in metadata],
        "shapes": [list(m.shape) for m in metadata],
        "tensor_sizes": [m.numel for m in metadata],
        "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode("ascii"),
    }
