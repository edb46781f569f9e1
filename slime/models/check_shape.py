"""The fields of GLM-4.5 / DeepSeek-V3's MoE routers and of multi-head latent attention against the family
(`model.architecture`, slime.models.families.FAMILIES): set where the family has them, consistent where it does."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.schema import ModelConfig
from slime.models.families import FAMILIES, GROUPED_MOE_KEYS, MLA_KEYS

# the schema's defaults of the grouped routers' fields: what a family without such a router keeps
GROUPED_MOE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name in GROUPED_MOE_KEYS}


def check_model_shape(model: ModelConfig) -> Iterator[Problem]:
    family = FAMILIES.get(model.architecture)
    if family is None:
        return  # reported by check_choices
    arch = f"model.architecture={model.architecture}"
    if not family.mla:
        for key in MLA_KEYS:
            if getattr(model, key) is not None:
                yield Problem(f"model.{key}", getattr(model, key), f"{arch} has no latent attention", "drop it")
    else:
        yield from _check_mla(model, arch)
    if not family.grouped_moe:
        for key, default in GROUPED_MOE_DEFAULTS.items():
            if getattr(model, key) != default:
                yield Problem(f"model.{key}", getattr(model, key), f"{arch} has no such router", "drop it")
    else:
        yield from _check_grouped_moe(model, arch)


def _check_mla(model: ModelConfig, arch: str) -> Iterator[Problem]:
    for key in list(MLA_KEYS)[1:]:  # q_lora_rank may be None: q through one projection
        if getattr(model, key) is None or getattr(model, key) <= 0:
            yield Problem(f"model.{key}", getattr(model, key), f"{arch} needs it > 0", f"set model.{key}=<HF value>")
    if model.kv_channels != model.qk_pos_emb_head_dim:
        yield Problem(
            "model.kv_channels",
            model.kv_channels,
            f"{arch}: transformers' head_dim is the rotary part of a q/k head, "
            f"model.qk_pos_emb_head_dim={model.qk_pos_emb_head_dim}",
            f"set model.kv_channels={model.qk_pos_emb_head_dim}",
        )
    if model.num_query_groups != model.num_attention_heads:
        yield Problem(
            "model.num_query_groups",
            model.num_query_groups,
            f"{arch}: every head has its own key and value (num_key_value_heads = num_attention_heads)",
            f"set model.num_query_groups={model.num_attention_heads}",
        )


def _check_grouped_moe(model: ModelConfig, arch: str) -> Iterator[Problem]:
    if not 0 <= model.moe_first_dense_layers <= model.num_layers:  # all dense: transformers builds no MoE layer
        yield Problem(
            "model.moe_first_dense_layers",
            model.moe_first_dense_layers,
            f"must be in [0, model.num_layers={model.num_layers}]",
            "set it to the checkpoint's first_k_dense_replace",
        )
    shared, width = model.moe_shared_expert_intermediate_size, model.moe_ffn_hidden_size
    if shared and width and shared % width:
        yield Problem(
            "model.moe_shared_expert_intermediate_size",
            shared,
            f"{arch}: the shared experts are n_shared_experts of model.moe_ffn_hidden_size={width}",
            f"set it to a multiple of {width}",
        )
    groups, topk = model.moe_router_num_groups, model.moe_router_group_topk
    if groups is None or topk is None or groups <= 0 or (model.num_experts or 0) % groups or not 1 <= topk <= groups:
        yield Problem(
            "model.moe_router_group_topk",
            (groups, topk),
            f"model.moe_router_num_groups must divide model.num_experts={model.num_experts} and "
            "model.moe_router_group_topk be in [1, it]",
            "set both to the checkpoint's n_group and topk_group (1 and 1: no groups)",
        )
