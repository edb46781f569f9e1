"""Log-probs and entropy of target tokens, vocab-parallel over the tensor-parallel ranks
(docs/algorithms.md#log-probs-and-the-reuse-rule).

Each TP rank holds rows [v0, v0 + V/tp) of the LM head, so its logits are a vocab shard; the full
logits are never gathered. Per token, in fp32 at temperature T:
    m = max over ranks of max(z/T)                 (all-reduce MAX, no gradient: a constant shift)
    s = Σ_ranks Σ_v exp(z/T − m)                   (all-reduce SUM)
    log p(target) = z_target/T − m − log s         (z_target from the one rank that holds it)
    H = m + log s − Σ_ranks Σ_v softmax·z/T
The all-reduces carry megatron's tensor-parallel convention (forward sum, backward identity), and the
hidden states enter through `copy_to_tensor_model_parallel_region` (backward sum), like megatron's
vocab-parallel cross entropy. Rows are processed `chunk_size` at a time under activation
checkpointing, so the fp32 logits of at most one chunk exist at once; on CUDA without tensor
parallelism each chunk runs torch.compile'd (like `slime.algo.logprobs`).
"""

from __future__ import annotations

import functools

import torch
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)
from torch import Tensor
from torch.utils.checkpoint import checkpoint


@functools.cache
def _compiled_chunk():
    """`_chunk` compiled for CUDA without tensor parallelism (no collectives inside): the fp32 [rows, V]
    logits go through a few fused kernels instead of one kernel, and one full read and write, per
    elementwise op; dynamic shapes, one graph for every chunk."""
    return torch.compile(_chunk, dynamic=True)


def _chunk(hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, with_entropy: bool, group) -> Tensor:
    z = torch.matmul(hidden, weight.t()).float() / temperature  # [n, V/tp]
    tp = torch.distributed.get_world_size(group) if group is not None else 1
    shard = weight.shape[0]
    start = torch.distributed.get_rank(group) * shard if tp > 1 else 0
    m = z.detach().max(dim=-1).values
    if tp > 1:
        torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX, group=group)
    shifted = z - m.unsqueeze(-1)
    exp = shifted.exp()
    local = targets - start
    inside = (local >= 0) & (local < shard)
    picked = shifted.gather(-1, local.clamp(0, shard - 1).unsqueeze(-1)).squeeze(-1) * inside
    sums = [exp.sum(-1), picked]
    if with_entropy:
        sums.append((exp * shifted).sum(-1))
    stacked = torch.stack(sums, dim=-1)
    if tp > 1:
        stacked = reduce_from_tensor_model_parallel_region(stacked, group=group)
    log_s = stacked[:, 0].log()
    log_probs = stacked[:, 1] - log_s
    if not with_entropy:
        return log_probs.unsqueeze(-1)
    entropy = log_s - stacked[:, 2] / stacked[:, 0]  # (m + log s) − Σ softmax·(z/T), the m terms cancel
    return torch.stack([log_probs, entropy], dim=-1)


def vocab_parallel_log_probs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    temperature: float,
    with_entropy: bool,
    chunk_size: int = 1024,
    group=None,
) -> tuple[Tensor, Tensor | None]:
    """(log_probs Tensor[n], entropy Tensor[n] | None), fp32 nats, of `targets` (Tensor[n] int64, full
    vocab ids) under softmax(hidden @ weight.T / T); hidden: Tensor[n, h] (replicated over the tp
    `group`), weight: Tensor[V/tp, h], this rank's vocab shard. Grad if enabled."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    tp = torch.distributed.get_world_size(group) if group is not None and torch.distributed.is_initialized() else 1
    if tp > 1:
        hidden = copy_to_tensor_model_parallel_region(hidden, group=group)
    group = group if tp > 1 else None
    track = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    chunk = _compiled_chunk() if hidden.is_cuda and group is None else _chunk
    parts = []
    for start in range(0, max(hidden.shape[0], 1), chunk_size):
        args = (
            hidden[start : start + chunk_size],
            weight,
            targets[start : start + chunk_size],
            temperature,
            with_entropy,
            group,
        )
        parts.append(checkpoint(chunk, *args, use_reentrant=False) if track else chunk(*args))
    out = torch.cat(parts)
    return out[:, 0], (out[:, 1] if with_entropy else None)
