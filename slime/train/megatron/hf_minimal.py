"""A minimal HF <-> megatron weight mapping for the dense Qwen3/Qwen2/Llama and Qwen3-MoE families.

Stop-gap until `slime.train.megatron.hf_weights` (the full converter) lands: it reads every safetensors
file into memory and gathers exported tensors through `all_gather_object`, which is fine for the tiny
test models and the embedded run, not for 8B ones. Names are megatron's local-spec names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")
LAYER_MAP = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.router.weight": "mlp.gate.weight",
    "mlp.shared_experts.linear_fc2.weight": "mlp.shared_expert.down_proj.weight",
    "mlp.shared_experts.gate_weight": "mlp.shared_expert_gate.weight",
}
GATED = {
    "mlp.linear_fc1.weight": "mlp.{}_proj.weight",
    "mlp.shared_experts.linear_fc1.weight": "mlp.shared_expert.{}_proj.weight",
}


def read_hf(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def _groups(cfg) -> tuple[int, int, int]:
    return cfg.num_attention_heads // cfg.num_query_groups, cfg.num_query_groups, cfg.kv_channels


def hf_tensors_for(
    name: str, layer_offset: int, cfg, hf: dict[str, torch.Tensor], *, ep_offset: int = 0
) -> torch.Tensor:
    """The full (unsplit) megatron tensor `name` (chunk-local layer numbering) from HF tensors `hf`."""
    if name == "embedding.word_embeddings.weight":
        return hf["model.embed_tokens.weight"]
    if name == "decoder.final_layernorm.weight":
        return hf["model.norm.weight"]
    if name == "output_layer.weight":
        return hf.get("lm_head.weight", hf["model.embed_tokens.weight"])
    layer, rest = LAYER.match(name).groups()
    pre = f"model.layers.{int(layer) + layer_offset}."
    if rest in LAYER_MAP:
        return hf[pre + LAYER_MAP[rest]]
    if rest in GATED:
        return torch.stack([hf[pre + GATED[rest].format(p)] for p in ("gate", "up")])  # [2, f, h]
    if rest.startswith("self_attention.linear_qkv."):
        kind = rest.rsplit(".", 1)[1]
        per, groups, d = _groups(cfg)
        q, k, v = (hf[f"{pre}self_attn.{p}_proj.{kind}"] for p in "qkv")
        q = q.reshape(groups, per * d, *q.shape[1:])
        k, v = k.reshape(groups, d, *k.shape[1:]), v.reshape(groups, d, *v.shape[1:])
        return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])
    expert = EXPERT.match(rest)
    if expert:
        e, which = int(expert.group(1)) + ep_offset, expert.group(2)
        base = f"{pre}mlp.experts.{e}."
        if which == "linear_fc2":
            return hf[base + "down_proj.weight"]
        return torch.stack([hf[base + "gate_proj.weight"], hf[base + "up_proj.weight"]])
    raise KeyError(f"no HF source for megatron parameter {name}")


def _split(full: torch.Tensor, param, rank: int, size: int) -> torch.Tensor:
    if full.dim() == 3:  # gated fc1 [2, f, h]: each rank holds [gate shard; up shard]
        return torch.cat([part.chunk(size, dim=0)[rank] for part in full])
    if not getattr(param, "tensor_model_parallel", False) or size == 1:
        return full
    return full.chunk(size, dim=param.partition_dim)[rank]


def _layer_offset(chunk) -> int:
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return get_transformer_layer_offset(chunk.config, vp_stage=getattr(chunk, "vp_stage", None))


def _is_expert(name: str) -> bool:
    return ".mlp.experts." in name


def _tp(name: str) -> tuple[int, int, object]:
    from megatron.core import parallel_state as ps

    if _is_expert(name):
        return (
            ps.get_expert_tensor_parallel_rank(),
            ps.get_expert_tensor_parallel_world_size(),
            ps.get_expert_tensor_parallel_group(),
        )
    return (
        ps.get_tensor_model_parallel_rank(),
        ps.get_tensor_model_parallel_world_size(),
        ps.get_tensor_model_parallel_group(),
    )


def _ep_offset(cfg) -> int:
    from megatron.core import parallel_state as ps

    return ps.get_expert_model_parallel_rank() * (cfg.num_experts or 0) // ps.get_expert_model_parallel_world_size()


@torch.no_grad()
def load_hf(chunks, path: str, model_cfg) -> None:
    """Copy the HF checkpoint at `path` into this rank's megatron chunks (every shard this rank holds)."""
    hf = read_hf(path)
    for chunk in chunks:
        module = getattr(chunk, "module", chunk)
        offset = _layer_offset(module)
        for name, param in module.named_parameters():
            if name == "output_layer.weight" and param.shape[0] == 1:  # a critic's value head: not in HF
                continue
            full = hf_tensors_for(
                name, offset, model_cfg, hf, ep_offset=_ep_offset(model_cfg) if _is_expert(name) else 0
            )
            rank, size, _ = _tp(name)
            param.copy_(_split(full, param, rank, size).to(param.dtype))


def _gather(tensor: torch.Tensor, name: str, param) -> torch.Tensor:
    rank, size, group = _tp(name)
    if size == 1 or not getattr(param, "tensor_model_parallel", False):
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    if name.endswith("linear_fc1.weight"):
        halves = [p.chunk(2) for p in parts]
        return torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])
    return torch.cat(parts, dim=param.partition_dim)


def to_hf(
    name: str, tensor: torch.Tensor, layer_offset: int, cfg, ep_offset: int = 0
) -> list[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs of one full megatron tensor (the inverse of `hf_tensors_for`)."""
    if name == "embedding.word_embeddings.weight":
        return [("model.embed_tokens.weight", tensor)]
    if name == "decoder.final_layernorm.weight":
        return [("model.norm.weight", tensor)]
    if name == "output_layer.weight":
        return [] if cfg.tie_word_embeddings else [("lm_head.weight", tensor)]
    layer, rest = LAYER.match(name).groups()
    pre = f"model.layers.{int(layer) + layer_offset}."
    if rest in LAYER_MAP:
        return [(pre + LAYER_MAP[rest], tensor)]
    if rest in GATED:
        gate, up = tensor.chunk(2)
        return [(pre + GATED[rest].format("gate"), gate), (pre + GATED[rest].format("up"), up)]
    if rest.startswith("self_attention.linear_qkv."):
        kind = rest.rsplit(".", 1)[1]
        per, groups, d = _groups(cfg)
        grouped = tensor.reshape(groups, (per + 2) * d, *tensor.shape[1:])
        q, k, v = grouped.split([per * d, d, d], dim=1)
        return [(f"{pre}self_attn.{p}_proj.{kind}", t.reshape(-1, *tensor.shape[1:])) for p, t in zip("qkv", (q, k, v))]
    e, which = EXPERT.match(rest).groups()
    base = f"{pre}mlp.experts.{int(e) + ep_offset}."
    if which == "linear_fc2":
        return [(base + "down_proj.weight", tensor)]
    gate, up = tensor.chunk(2)
    return [(base + "gate_proj.weight", gate), (base + "up_proj.weight", up)]


@torch.no_grad()
def export_hf(chunks, model_cfg, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Every HF-named tensor of the model, on every rank (collective over tp, ep and pp), in buckets."""
    from megatron.core import parallel_state as ps

    local: list[tuple[str, torch.Tensor]] = []
    for chunk in chunks:
        module = getattr(chunk, "module", chunk)
        offset = _layer_offset(module)
        for name, param in module.named_parameters():
            full = _gather(param.detach(), name, param)
            if _is_expert(name):
                local.extend(_gather_experts(name, full, offset, model_cfg))
            else:
                local.extend(to_hf(name, full, offset, model_cfg))
    pairs = local
    if ps.get_pipeline_model_parallel_world_size() > 1:
        stages: list = [None] * ps.get_pipeline_model_parallel_world_size()
        dist.all_gather_object(stages, [(n, t.cpu()) for n, t in local], group=ps.get_pipeline_model_parallel_group())
        pairs = [pair for stage in stages for pair in stage]
    bucket, size = [], 0
    for name, tensor in sorted(dict(pairs).items(), key=lambda kv: _hf_order(kv[0])):
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def _gather_experts(name: str, full: torch.Tensor, offset: int, cfg) -> list[tuple[str, torch.Tensor]]:
    from megatron.core import parallel_state as ps

    ep = ps.get_expert_model_parallel_world_size()
    if ep == 1:
        return to_hf(name, full, offset, cfg)
    parts = [torch.empty_like(full) for _ in range(ep)]
    dist.all_gather(parts, full.contiguous(), group=ps.get_expert_model_parallel_group())
    per = cfg.num_experts // ep
    return [pair for r, part in enumerate(parts) for pair in to_hf(name, part, offset, cfg, ep_offset=r * per)]


def _hf_order(name: str) -> tuple:
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return (1, int(m.group(1)), name) if m else (0 if "embed" in name else 2, 0, name)


def hf_config(path: str) -> dict:
    return json.loads((Path(path) / "config.json").read_text())
