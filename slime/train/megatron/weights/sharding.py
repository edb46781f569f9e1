"""How a whole megatron tensor splits over tensor-parallel ranks, and back (pure tensor math).

    layout      parameters                                          rank r of n holds
    column      linear_qkv.weight/.bias                             rows r/n (whole query groups)
                latent attention's q/kv up projections (q_proj)     rows r/n
    glu         linear_fc1.weight (dense, expert, shared expert)    [gate rows r/n ; up rows r/n]
    row         linear_proj.weight, linear_fc2.weight               columns r/n
    vocab       word_embeddings.weight, output_layer.weight         padded-vocab rows r/n
    replicated  norms, router, shared-expert gate,                  everything
                latent attention's q/kv down projections

Experts (`.mlp.experts.`) split over the expert-tensor-parallel group instead of the tensor-parallel
one; expert parallelism places whole experts (`global_expert`). Vocab rows are padded with zeros to the
model's padded vocabulary before splitting and trimmed back after gathering.
"""

from __future__ import annotations

import torch

VOCAB_DIVISOR = 128  # megatron's --make-vocab-size-divisible-by default
# latent attention's head-wise projections (ColumnParallelLinear); the down-projections are whole on every rank
# (`model_config._duplicated_linear`)
LATENT_COLUMNS = tuple(f"{proj}.weight" for proj in ("linear_q_proj", "linear_q_up_proj", "linear_kv_up_proj"))


def tp_layout(name: str) -> str:
    """The layout (module docstring) of a megatron parameter name."""
    if name.endswith(("word_embeddings.weight", "output_layer.weight")):
        return "vocab"
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias", *LATENT_COLUMNS)):
        return "column"
    if name.endswith("linear_fc1.weight"):
        return "glu"
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return "row"
    return "replicated"


def is_expert(name: str) -> bool:
    """Routed-expert parameters (split by expert tp and placed by ep); shared experts are not."""
    return ".mlp.experts." in name


def padded_vocab_size(vocab_size: int, tp: int, divisor: int = VOCAB_DIVISOR) -> int:
    """megatron-training's padding: the next multiple of divisor·tp (151936 -> 152064 at tp 2)."""
    multiple = divisor * tp
    return -(-vocab_size // multiple) * multiple


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """`tensor` with zero rows appended up to `rows` (padded vocabulary entries)."""
    if tensor.shape[0] > rows:
        raise ValueError(f"{tensor.shape[0]} vocabulary rows do not fit the model's {rows}")
    if tensor.shape[0] == rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def shard(full: torch.Tensor, layout: str, rank: int, size: int) -> torch.Tensor:
    """Rank `rank`'s part of the whole tensor (vocab rows already padded to a multiple of `size`)."""
    if layout == "replicated" or size == 1:
        return full
    if layout == "glu":
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]])
    dim = 1 if layout == "row" else 0
    if full.shape[dim] % size:
        raise ValueError(f"dimension {dim} of size {full.shape[dim]} does not split over {size} ranks")
    return full.chunk(size, dim=dim)[rank]


def unshard(shards: list[torch.Tensor], layout: str) -> torch.Tensor:
    """The whole tensor from every rank's part, in rank order (inverse of `shard`)."""
    if layout == "replicated" or len(shards) == 1:
        return shards[0]
    if layout == "glu":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(shards, dim=1 if layout == "row" else 0)


def global_expert(local_index: int, ep_rank: int, num_local: int) -> int:
    """megatron-core's placement: ep rank r holds experts r·num_local .. (r+1)·num_local - 1."""
    return ep_rank * num_local + local_index
