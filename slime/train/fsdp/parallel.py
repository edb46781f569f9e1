"""Parallelism of the fsdp backend as plain `apply_*` functions over the group's `RankLayout`.

- Data parallel: FSDP2 on CUDA (parameters sharded over the dp ranks); on CPU replicated weights and a
  gloo all-reduce of the gradients over the dp ranks.
- Tensor parallel (`parallelism.tp`): torch's DTensor tensor parallelism on each decoder layer, the
  Megatron split: q/k/v and gate/up projections by output columns, o and down projections by input
  rows, so a layer needs one all-reduce forward and one backward. Embeddings, norms and the LM head
  stay replicated, so every tp rank holds the full logits. Works over gloo on CPU and NCCL on CUDA.

Gradients are SUMMED over dp ranks: each rank's loss already carries step-level weights (1/G or
1/total tokens), so the sum is the step gradient whatever the split. FSDP2 averages, so its loss is
scaled by the dp size (`loss_scale`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from slime.models.hf_model import decoder_layers
from slime.train.layout import RankLayout
from slime.train.process_group import init_default_group

# Per decoder layer (Llama / Qwen module names): the Megatron split.
TP_COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
TP_ROWWISE = ("self_attn.o_proj", "mlp.down_proj")
# Replicated parameters applied inside the split region (Qwen3's per-head q/k norms): each tp rank sees
# only its own heads, so their gradients are partial sums over the tp ranks.
TP_PARTIAL_GRADS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


def init_process_group(*, device: str, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    """gloo on CPU (only when there are several ranks), nccl on CUDA (always: FSDP2 needs a group)."""
    if world_size == 1 and device != "cuda":
        return
    init_default_group(
        device=device, rank=rank, world_size=world_size, master_addr=master_addr, master_port=master_port
    )


class Groups:
    """The process groups of one rank: `dp` (same model slice, gradients summed) and `tp`; None = none needed."""

    def __init__(self, layout: RankLayout, device: str):
        self.layout = layout
        self.mesh = None
        self.dp = self.tp = None
        if layout.tp > 1:
            # Rank order tp fastest, then dp (RankLayout): a (dp, tp) row-major mesh.
            self.mesh = init_device_mesh(device, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
            self.dp, self.tp = self.mesh.get_group("dp"), self.mesh.get_group("tp")
        elif layout.world_size > 1 or device == "cuda":
            self.dp = dist.group.WORLD

    def dp_mesh(self):
        return None if self.mesh is None else self.mesh["dp"]


def uses_fsdp(device: str) -> bool:
    """FSDP2 on every CUDA run (one rank included, so a single GPU exercises the same path)."""
    return device == "cuda"


def apply_tensor_parallel(model: nn.Module, groups: Groups) -> None:
    """Split every decoder layer's projections over the tp ranks (no-op with tp = 1)."""
    if groups.mesh is None:
        return

    plan = {name: ColwiseParallel() for name in TP_COLWISE} | {name: RowwiseParallel() for name in TP_ROWWISE}
    for layer in decoder_layers(model):
        parallelize_module(layer, groups.mesh["tp"], plan)


def apply_data_parallel(
    model: nn.Module, *, device: str, groups: Groups, bf16_params: bool = False, cpu_offload: bool = False
) -> nn.Module:
    """Shard every decoder layer and the root with FSDP2 over the dp ranks on CUDA; as is on CPU.

    bf16_params: FSDP2's mixed-precision policy: parameters stay fp32 in their shards (and in the
    optimizer) and are cast to bf16 when gathered for compute; gradients are reduced in fp32.
    cpu_offload: FSDP2's CPU offload policy: parameter shards, gradients and the optimizer state live in
    host memory and the optimizer steps on the CPU (slower; for models whose state does not fit).
    """
    if not uses_fsdp(device):
        return model

    # One dp rank holds every parameter anyway: resharding after the forward would only gather again in the backward.
    options: dict = {"mesh": groups.dp_mesh(), "reshard_after_forward": groups.layout.dp > 1}
    if bf16_params:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return model


def loss_scale(device: str, layout: RankLayout) -> float:
    """FSDP2 divides reduced gradients by the dp size; undo it so gradients are sums."""
    return float(layout.dp) if uses_fsdp(device) else 1.0


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _all_reduce_flat(grads: list[torch.Tensor], group) -> None:
    """SUM-all-reduce `grads` in place through one flat buffer."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def sum_gradients(model: nn.Module, *, device: str, groups: Groups) -> None:
    """Complete the gradients: the partial sums of replicated parameters inside the tp split over the
    tp ranks; then every gradient over the dp ranks (FSDP2 has already reduced its own)."""
    if groups.tp is not None:
        _all_reduce_flat(
            [
                _local(p.grad)
                for name, p in model.named_parameters()
                if p.grad is not None and name.endswith(TP_PARTIAL_GRADS)
            ],
            groups.tp,
        )
    if groups.dp is None or groups.layout.dp == 1 or uses_fsdp(device):
        return
    _all_reduce_flat([_local(p.grad) for p in model.parameters() if p.grad is not None], groups.dp)


def clip_grad_norm(model: nn.Module, max_norm: float, groups: Groups) -> float:
    """Clip all gradients to a global L2 norm of `max_norm` (inf: no clipping); returns the norm before. A
    non-finite norm leaves the gradients as they are (clipping would spread the NaN to every one, hiding which
    tensor held it: slime.train.finite names it).

    Without tensor parallelism, torch's own clipping (clip_grad_norm_ is these two calls). With it, parameters are a
    mix of DTensors (split over tp, and over dp under FSDP2) and plain tensors (replicated, identical on every rank
    after the gradient sums): a DTensor's norm is reduced over its own mesh, a plain one counted once.
    """
    params = [p for p in model.parameters() if p.grad is not None]
    if groups.tp is None:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        total = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if math.isfinite(total):
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return total
    square = torch.zeros((), dtype=torch.float64)
    for p in params:
        if hasattr(p.grad, "full_tensor"):
            square += p.grad.float().norm().full_tensor().double().cpu() ** 2
        else:
            square += p.grad.double().pow(2).sum().cpu()
    total = math.sqrt(float(square))
    coef = max_norm / (total + 1e-6)
    if math.isfinite(total) and coef < 1.0:
        for p in params:
            _local(p.grad).mul_(coef)
    return total


def all_reduce_sum(tensor: torch.Tensor, group) -> torch.Tensor:
    """Sum over `group` in place (no-op without one)."""
    if group is not None and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def all_reduce_max(tensor: torch.Tensor, group) -> torch.Tensor:
    """Max over `group` in place (no-op without one)."""
    if group is not None and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return tensor


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
