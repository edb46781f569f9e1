"""Data parallelism for the fsdp backend: FSDP2 on CUDA, replicated weights + gloo all-reduce on CPU.

Gradients are SUMMED over ranks: each rank's loss already carries step-level weights (1/G or
1/total tokens), so the sum is the step gradient whatever the split. FSDP2 averages, so its loss is
scaled by the data-parallel size (`loss_scale`).
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch import nn


def init_process_group(*, device: str, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    """gloo on CPU (only when there are several ranks), nccl on CUDA (always: FSDP2 needs a group)."""
    if dist.is_initialized() or (world_size == 1 and device != "cuda"):
        return
    dist.init_process_group(
        backend="nccl" if device == "cuda" else "gloo",
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(minutes=30),
    )


def uses_fsdp(device: str) -> bool:
    """FSDP2 on every CUDA run (one rank included, so a single GPU exercises the same path)."""
    return device == "cuda"


def apply_data_parallel(model: nn.Module, *, device: str) -> nn.Module:
    """Shard every decoder layer and the root with FSDP2 on CUDA; leave the model as is on CPU."""
    if not uses_fsdp(device):
        return model
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def loss_scale(device: str, world_size: int) -> float:
    """FSDP2 divides reduced gradients by the world size; undo it so gradients are sums."""
    return float(world_size) if uses_fsdp(device) else 1.0


def sum_gradients(model: nn.Module, *, device: str, world_size: int) -> None:
    """All-reduce (SUM) replicated gradients in one flat buffer; FSDP2 has already reduced its own."""
    if world_size == 1 or uses_fsdp(device):
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def all_reduce_sum(tensor: torch.Tensor, world_size: int) -> torch.Tensor:
    if world_size > 1 and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(world_size: int) -> None:
    if world_size > 1 and dist.is_initialized():
        dist.barrier()


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
