"""HF safetensors <-> a live (possibly tp/pp/vpp/ep-sharded) megatron-core model.

    load_hf(chunks, path, model_cfg)            every rank reads the HF tensors of its own parameters,
                                                 lays them out (weights/names.py) and keeps its shard
    load_hf_main_params(optimizer, chunks, ...)  the optimizer's fp32 master weights from an fp32 checkpoint
    export_hf(chunks, model_cfg, bucket_bytes)   the whole model as buckets of (HF name, tensor);
                                                 collective over every rank (TrainBackend.export_weights)

`chunks` are this rank's model chunks (one per virtual pipeline stage), bare or wrapped (DDP,
Float16Module). Parameters are identified by GLOBAL names: a chunk's layer k is
`decoder.layers.<layer_number - 1>`, its local expert j is `local_expert_indices[j]`.

Export, per parameter "unit" (a local name that is the same on every tp/ep rank of a stage): the owning
stage all-gathers the tp (expert tp for experts) shards and merges them, all-gathers the ep ranks' experts,
converts to HF names and trims the vocab padding; then, with pipeline stages, it broadcasts the HF
tensors to the other stages. Units are walked in the same order on every rank (stage by stage, each in
its parameter order), so every group's collectives line up. Every rank ends with every bucket; the
source rank's are the ones used. A tied output layer (the last stage's copy of the embedding) is not
exported: `model.embed_tokens.weight` is sent once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.utils import unwrap_model

from slime.config.schema import ModelConfig
from slime.train.megatron.weights import names, sharding
from slime.train.megatron.weights.hf_reader import HFReader
from slime.wire.tensors import Bucket, in_buckets

HALF_PRECISION = {"BF16", "F16"}  # safetensors dtypes no finer than the bf16 parameters


@dataclasses.dataclass(frozen=True)
class LocalParam:
    """One parameter (or state buffer) of this rank: `name` global (global expert index), `unit` with the local
    expert index."""

    name: str
    unit: str
    param: torch.Tensor


def unwrap(chunks) -> list[torch.nn.Module]:
    """The bare GPTModel of each chunk (DDP / Float16Module wrappers removed)."""
    return unwrap_model(list(chunks) if isinstance(chunks, list | tuple) else [chunks])


def state_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's parameters, then its buffers that are model state (`names.STATE_BUFFERS`), by local name."""
    yield from module.named_parameters()
    yield from ((name, b) for name, b in module.named_buffers() if names.canonical(name).endswith(names.STATE_BUFFERS))


def local_parameters(chunks) -> list[LocalParam]:
    """This rank's parameters under global names, in chunk order then parameter order."""
    out = []
    for chunk in unwrap(chunks):
        for local_name, param in state_tensors(chunk):
            name = names.canonical(local_name)
            layer, rest = names.split_layer(name)
            if layer is None:
                out.append(LocalParam(name, name, param))
                continue
            module = chunk.decoder.layers[layer]
            global_layer = module.layer_number - 1
            local_expert, tail = names.split_expert(rest)
            if local_expert is None:
                full = names.layer_name(global_layer, rest)
                out.append(LocalParam(full, full, param))
                continue
            expert = module.mlp.local_expert_indices[local_expert]
            out.append(
                LocalParam(
                    names.layer_name(global_layer, names.expert_rest(expert, tail)),
                    names.layer_name(global_layer, names.expert_rest(local_expert, tail)),
                    param,
                )
            )
    return out


def _split_group(name: str):
    """(group, rank, size) over which parameter `name` is tensor-parallel split."""
    if sharding.is_expert(name):
        return (
            ps.get_expert_tensor_parallel_group(),
            ps.get_expert_tensor_parallel_rank(),
            ps.get_expert_tensor_parallel_world_size(),
        )
    return (
        ps.get_tensor_model_parallel_group(),
        ps.get_tensor_model_parallel_rank(),
        ps.get_tensor_model_parallel_world_size(),
    )


@torch.no_grad()
def load_hf(chunks, path: str | Path, model_cfg: ModelConfig, *, head: str = "lm") -> int:
    """Copy the HF checkpoint at `path` into this rank's shards; returns the number of parameters set.

    head="value" (a critic, `build_model_chunks(head="value")`) leaves its value head, which HF does not
    have, as built. Call before the optimizer copies the parameters, then `load_hf_main_params`.
    """
    count = 0
    for p, local in checkpoint_shards(chunks, path, model_cfg, head=head):
        p.param.copy_(local)
        count += 1
    return count


@torch.no_grad()
def load_hf_main_params(optimizer, chunks, path: str | Path, model_cfg: ModelConfig, *, head: str = "lm") -> int:
    """The optimizer's fp32 master weights from the checkpoint's own values where they are finer than the
    bf16 parameters (an fp32 checkpoint); returns how many parameters were set.

    megatron's optimizer makes its master weights from the bf16 parameters, so those of an fp32 checkpoint start
    rounded to the bf16 grid, and an update smaller than half a bf16 step rounds back to the same bf16 weight:
    at lr 5e-6 most weights of SmolLM2 (|w| ~ 0.03, step ~1.2e-4) stay unchanged for about ten steps, where
    fsdp's fp32 shards (the checkpoint's values) move from the first. Reads each tensor again (lazily) rather than keeping a second copy of the model from `load_hf`.
    """
    shards = main_param_shards(optimizer)
    if not shards or not HFReader(path).dtype_names() - HALF_PRECISION:
        return 0  # a bf16 checkpoint: the master weights made from the parameters are its values already
    count = 0
    for p, local in checkpoint_shards(chunks, path, model_cfg, head=head):
        target = shards.get(p.param)
        if target is None or local.dtype.itemsize <= p.param.dtype.itemsize:
            continue
        main, start, end = target
        main.copy_(local.reshape(-1)[start:end].to(device=main.device, dtype=main.dtype))
        count += 1
    return count


def main_param_shards(optimizer) -> dict[torch.nn.Parameter, tuple[torch.Tensor, int, int]]:
    """bf16 model parameter -> (its fp32 master shard, start, end in the flattened parameter), over the
    distributed optimizers of a (chained) megatron optimizer; as megatron-core's own
    DistributedOptimizer._copy_model_params_to_main_params pairs them (optimizer/distrib_optimizer.py)."""
    out = {}
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        groups = zip(getattr(inner, "model_float16_groups", ()), getattr(inner, "shard_fp32_from_float16_groups", ()))
        for model_group, main_group in groups:
            for model_param, main in zip(model_group, main_group):
                span = inner._get_model_param_range_map(model_param)["param"]
                out[model_param] = (main, span.start, span.end)
    return out


def checkpoint_shards(chunks, path: str | Path, model_cfg: ModelConfig, *, head: str) -> Iterator[tuple]:
    """(LocalParam, this rank's shard of it in the checkpoint's dtype) for every parameter HF holds."""
    table = names.rule_table(model_cfg)
    reader = HFReader(path)
    for p in local_parameters(chunks):
        if head == "value" and p.name == "output_layer.weight":
            continue
        rule = table.get(p.name)
        if rule is None:
            raise KeyError(f"megatron parameter {p.name!r} has no HF counterpart for {model_cfg.architecture}")
        full = names.to_megatron(model_cfg, rule, reader.get)
        layout = sharding.tp_layout(p.name)
        _, rank, size = _split_group(p.name)
        if layout == "vocab":
            full = sharding.pad_rows(full, p.param.shape[0] * size)
        local = sharding.shard(full, layout, rank, size)
        if tuple(local.shape) != tuple(p.param.shape):
            raise ValueError(
                f"{path}: {rule.hf} give {p.name} shard {tuple(local.shape)}, the model has {tuple(p.param.shape)}"
            )
        yield p, local


def _all_gather(tensor: torch.Tensor, group, size: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return parts


def _unit_names(unit: str, model_cfg: ModelConfig) -> list[str]:
    """Global megatron names a unit stands for: every ep rank's expert j for an expert unit."""
    layer, rest = names.split_layer(unit)
    local_expert, tail = names.split_expert(rest)
    if local_expert is None:
        return [unit]
    ep = ps.get_expert_model_parallel_world_size()
    num_local = model_cfg.num_experts // ep
    return [
        names.layer_name(layer, names.expert_rest(sharding.global_expert(local_expert, r, num_local), tail))
        for r in range(ep)
    ]


def _gather_unit(p: LocalParam, model_cfg: ModelConfig, table: dict) -> list[tuple[str, torch.Tensor]]:
    """The owning stage's HF tensors of one unit (tp shards merged, every ep rank's expert)."""
    layout = sharding.tp_layout(p.name)
    group, _, size = _split_group(p.name)
    tensor = p.param.detach()
    if size > 1 and layout != "replicated":
        tensor = sharding.unshard(_all_gather(tensor, group, size), layout)
    if layout == "vocab":
        tensor = tensor[: model_cfg.vocab_size]
    full = [tensor]
    ep = ps.get_expert_model_parallel_world_size()
    if sharding.is_expert(p.name) and ep > 1:
        full = _all_gather(tensor, ps.get_expert_model_parallel_group(), ep)
    return [
        (hf_name, hf_tensor.contiguous())
        for name, t in zip(_unit_names(p.unit, model_cfg), full)
        for hf_name, hf_tensor in names.to_hf(model_cfg, table[name], t)
    ]


def _stage_units(params: list[LocalParam], model_cfg: ModelConfig) -> list[tuple[int, str, torch.dtype]]:
    """(owning pp stage, unit, dtype) of every exported unit of the pipeline, stage by stage."""
    mine = [
        (p.unit, p.param.dtype)
        for p in params
        if not (p.name == "output_layer.weight" and model_cfg.tie_word_embeddings)
    ]
    size = ps.get_pipeline_model_parallel_world_size()
    if size == 1:
        return [(0, unit, dtype) for unit, dtype in mine]
    every: list = [None] * size
    dist.all_gather_object(every, mine, group=ps.get_pipeline_model_parallel_group())
    return [(stage, unit, dtype) for stage, units in enumerate(every) for unit, dtype in units]


def export_hf(chunks, model_cfg: ModelConfig, bucket_bytes: int) -> Iterator[Bucket]:
    """Buckets of about `bucket_bytes` of (HF name, whole tensor) for the whole model; every rank must run
    it to the end (collective). Tensors keep the parameters' dtype and device."""
    table = names.rule_table(model_cfg)
    params = local_parameters(chunks)
    by_unit = {p.unit: p for p in params}
    stage = ps.get_pipeline_model_parallel_rank()
    pp_group = ps.get_pipeline_model_parallel_group()
    device = params[0].param.device

    def unit_tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for owner, unit, dtype in _stage_units(params, model_cfg):
            if owner == stage:
                tensors = _gather_unit(by_unit[unit], model_cfg, table)
            else:
                hf = [name for g in _unit_names(unit, model_cfg) for name in table[g].hf]
                tensors = [(n, torch.empty(names.hf_shape(model_cfg, n), dtype=dtype, device=device)) for n in hf]
            if ps.get_pipeline_model_parallel_world_size() > 1:
                src = dist.get_global_rank(pp_group, owner)
                for _, tensor in tensors:
                    dist.broadcast(tensor, src=src, group=pp_group)
            yield from tensors

    return in_buckets(unit_tensors(), bucket_bytes)
