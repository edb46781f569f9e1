"""Process groups and RNG of one megatron rank.

The group's `RankLayout` orders ranks tp, cp, dp, pp (fastest first), which is megatron-core's
"tp-cp-ep-dp-pp" order with ep folded into dp, so megatron's groups match the layout the runtime
deals data by. torch.distributed is always initialised (megatron needs it, one rank included): gloo
on CPU (with the CPU shims active), NCCL on CUDA.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel

from slime.train.layout import RankLayout
from slime.train.megatron import cpu_shims, multi_tensor
from slime.train.process_group import init_default_group


def init(*, device: str, rank: int, layout: RankLayout, vpp: int | None, master_addr: str, master_port: int, seed: int):
    """Initialise torch.distributed, megatron's model-parallel groups and its RNG streams."""
    cpu_shims.activate(device)
    multi_tensor.activate(device)
    if device == "cuda":
        torch.cuda.set_device(torch.cuda.current_device())
    init_default_group(
        device=device, rank=rank, world_size=layout.world_size, master_addr=master_addr, master_port=master_port
    )
    ps.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=vpp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
    )
    seed = seed + 100 * ps.get_pipeline_model_parallel_rank()  # slime: distinct streams per stage
    torch.manual_seed(seed)
    if device == "cpu":
        cpu_shims.seed_rng_tracker(
            seed,
            tp_rank=ps.get_tensor_model_parallel_rank(),
            ep_rank=ps.get_expert_model_parallel_rank(),
            etp_rank=ps.get_expert_tensor_parallel_rank(),
        )
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def destroy() -> None:
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(tensor: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """In place over `group` (no-op when it has one rank)."""
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor
