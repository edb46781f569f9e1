"""HF <-> megatron-core tensor names and layouts for every family, on whole (unsharded) tensors.

Megatron names are those of megatron-core's GPTModel with the local layer spec, with GLOBAL layer and
expert indices (docs/models.md#checkpoint-tensor-names):

    embedding.word_embeddings.weight                       model.embed_tokens.weight (rows: HF vocab)
    decoder.layers.L.input_layernorm.weight                model.layers.L.input_layernorm.weight
    decoder.layers.L.self_attention.linear_qkv.weight      q_proj, k_proj, v_proj (query-group interleaved)
    decoder.layers.L.self_attention.linear_qkv.bias        q/k/v_proj.bias (qwen2, glm4)
    decoder.layers.L.self_attention.q_layernorm.weight     self_attn.q_norm.weight (qwen3, qwen3_moe)
    decoder.layers.L.self_attention.k_layernorm.weight     self_attn.k_norm.weight
    decoder.layers.L.self_attention.linear_proj.weight     self_attn.o_proj.weight
    decoder.layers.L.self_attention.linear_q_down_proj.weight   self_attn.q_a_proj.weight (deepseek_v3: latent
    decoder.layers.L.self_attention.q_layernorm.weight          self_attn.q_a_layernorm.weight   attention; with
    decoder.layers.L.self_attention.linear_q_up_proj.weight     self_attn.q_b_proj.weight        no q_lora_rank,
    decoder.layers.L.self_attention.linear_kv_down_proj.weight  self_attn.kv_a_proj_with_mqa.weight  linear_q_proj
    decoder.layers.L.self_attention.kv_layernorm.weight         self_attn.kv_a_layernorm.weight  <- q_proj)
    decoder.layers.L.self_attention.linear_kv_up_proj.weight    self_attn.kv_b_proj.weight
    decoder.layers.L.pre_mlp_layernorm.weight              post_attention_layernorm.weight
    decoder.layers.L.mlp.linear_fc1.weight                 mlp.gate_proj ; mlp.up_proj (concatenated rows)
    decoder.layers.L.mlp.linear_fc2.weight                 mlp.down_proj
    decoder.layers.L.mlp.router.weight                     mlp.gate.weight (MoE)
    decoder.layers.L.mlp.router.expert_bias                mlp.gate.e_score_correction_bias (glm4_moe, deepseek_v3)
    decoder.layers.L.mlp.experts.local_experts.E.linear_fc1.weight   mlp.experts.E.gate_proj ; up_proj
    decoder.layers.L.mlp.experts.local_experts.E.linear_fc2.weight   mlp.experts.E.down_proj
    decoder.layers.L.mlp.shared_experts.linear_fc1.weight  mlp.shared_expert.gate_proj ; up_proj
    decoder.layers.L.mlp.shared_experts.linear_fc2.weight  mlp.shared_expert.down_proj
    decoder.layers.L.mlp.shared_experts.gate_weight        mlp.shared_expert_gate.weight
                                                           (glm4_moe, deepseek_v3: mlp.shared_experts.*, ungated)
    decoder.final_layernorm.weight                         model.norm.weight
    output_layer.weight                                    lm_head.weight (untied only)

Transformer Engine's fused specs name the two pre-norms `linear_qkv.layer_norm_weight` and
`linear_fc1.layer_norm_weight`; `canonical()` maps them to the local names. The embedding here has the HF
vocab rows; vocab padding is a sharding matter (`sharding.py`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator

import torch

from slime.config.schema import ModelConfig
from slime.models.families import FAMILIES, Family

_TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}
# Buffers that are model state (a checkpoint tensor each, loaded and exported as the parameters are): the MoE
# router's expert-score bias. Other buffers (megatron's per-step token counts) are not.
STATE_BUFFERS = ("mlp.router.expert_bias",)
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(.*)$")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One megatron tensor and the HF tensors it is made of; `layout`: copy | qkv | glu (gate ; up)."""

    megatron: str
    hf: tuple[str, ...]
    layout: str = "copy"


def check_supported(model: ModelConfig) -> None:
    """Raise ValueError for a family without a megatron-core mapping (GLM-4's extra output norms)."""
    if model.architecture not in FAMILIES or not FAMILIES[model.architecture].megatron:
        raise ValueError(
            f"model.architecture={model.architecture!r} has no HF <-> megatron-core weight mapping "
            "(see its conf/model option); train it with parallelism=fsdp"
        )


def canonical(name: str) -> str:
    """The local-spec spelling of a megatron parameter name (TE fused-norm names mapped)."""
    for te, local in _TE_ALIASES.items():
        if name.endswith(te):
            return name[: -len(te)] + local
    return name


def split_layer(name: str) -> tuple[int | None, str]:
    """`decoder.layers.L.rest` -> (L, rest); other names -> (None, name)."""
    match = _LAYER.match(name)
    return (int(match.group(1)), match.group(2)) if match else (None, name)


def split_expert(rest: str) -> tuple[int | None, str]:
    """`mlp.experts.local_experts.E.tail` -> (E, tail); other names -> (None, rest)."""
    match = _EXPERT.match(rest)
    return (int(match.group(1)), match.group(2)) if match else (None, rest)


def layer_name(layer: int, rest: str) -> str:
    return f"decoder.layers.{layer}.{rest}"


def expert_rest(expert: int, tail: str) -> str:
    return f"mlp.experts.local_experts.{expert}.{tail}"


def _mlp_rules(prefix: str, hf_prefix: str) -> list[Rule]:
    return [
        Rule(f"{prefix}linear_fc1.weight", (f"{hf_prefix}gate_proj.weight", f"{hf_prefix}up_proj.weight"), "glu"),
        Rule(f"{prefix}linear_fc2.weight", (f"{hf_prefix}down_proj.weight",)),
    ]


def _layer_rules(model: ModelConfig, layer: int) -> list[Rule]:
    p, h = f"decoder.layers.{layer}.", f"model.layers.{layer}."
    rules = [
        Rule(f"{p}input_layernorm.weight", (f"{h}input_layernorm.weight",)),
        *_attention_rules(model, f"{p}self_attention.", f"{h}self_attn."),
        Rule(f"{p}pre_mlp_layernorm.weight", (f"{h}post_attention_layernorm.weight",)),
    ]
    if model.num_experts is None or layer < model.moe_first_dense_layers:
        return rules + _mlp_rules(f"{p}mlp.", f"{h}mlp.")
    return rules + _moe_rules(model, FAMILIES[model.architecture], p, h)


def _attention_rules(model: ModelConfig, p: str, a: str) -> list[Rule]:
    """Self-attention: fused q/k/v (query-group interleaved), or DeepSeek's latent attention, whose HF and
    megatron projections hold the same rows in the same order (per head: no-position dims, then rotated ones)."""
    if FAMILIES[model.architecture].mla:
        return _latent_attention_rules(model, p, a)
    rules = [
        Rule(f"{p}linear_qkv.weight", (f"{a}q_proj.weight", f"{a}k_proj.weight", f"{a}v_proj.weight"), "qkv"),
        Rule(f"{p}linear_proj.weight", (f"{a}o_proj.weight",)),
    ]
    if model.add_qkv_bias:
        rules.append(Rule(f"{p}linear_qkv.bias", (f"{a}q_proj.bias", f"{a}k_proj.bias", f"{a}v_proj.bias"), "qkv"))
    if model.qk_layernorm:
        rules.append(Rule(f"{p}q_layernorm.weight", (f"{a}q_norm.weight",)))
        rules.append(Rule(f"{p}k_layernorm.weight", (f"{a}k_norm.weight",)))
    return rules


def _latent_attention_rules(model: ModelConfig, p: str, a: str) -> list[Rule]:
    if model.q_lora_rank is None:
        query = [Rule(f"{p}linear_q_proj.weight", (f"{a}q_proj.weight",))]
    else:
        query = [
            Rule(f"{p}linear_q_down_proj.weight", (f"{a}q_a_proj.weight",)),
            Rule(f"{p}q_layernorm.weight", (f"{a}q_a_layernorm.weight",)),
            Rule(f"{p}linear_q_up_proj.weight", (f"{a}q_b_proj.weight",)),
        ]
    return [
        *query,
        Rule(f"{p}linear_kv_down_proj.weight", (f"{a}kv_a_proj_with_mqa.weight",)),
        Rule(f"{p}kv_layernorm.weight", (f"{a}kv_a_layernorm.weight",)),
        Rule(f"{p}linear_kv_up_proj.weight", (f"{a}kv_b_proj.weight",)),
        Rule(f"{p}linear_proj.weight", (f"{a}o_proj.weight",)),
    ]


def _moe_rules(model: ModelConfig, family: Family, p: str, h: str) -> list[Rule]:
    """A MoE layer's router, experts and shared experts (Qwen2-MoE's gated `shared_expert`; GLM-4.5's ungated
    `shared_experts` and the router's expert-score bias)."""
    rules = [Rule(f"{p}mlp.router.weight", (f"{h}mlp.gate.weight",))]
    if family.grouped_moe:
        rules.append(Rule(f"{p}mlp.router.expert_bias", (f"{h}mlp.gate.e_score_correction_bias",)))
    for e in range(model.num_experts):
        rules += _mlp_rules(f"{p}{expert_rest(e, '')}", f"{h}mlp.experts.{e}.")
    if not model.moe_shared_expert_intermediate_size:
        return rules
    if family.grouped_moe:
        return rules + _mlp_rules(f"{p}mlp.shared_experts.", f"{h}mlp.shared_experts.")
    rules += _mlp_rules(f"{p}mlp.shared_experts.", f"{h}mlp.shared_expert.")
    rules.append(Rule(f"{p}mlp.shared_experts.gate_weight", (f"{h}mlp.shared_expert_gate.weight",)))
    return rules


def rules(model: ModelConfig) -> Iterator[Rule]:
    """Every megatron tensor of `model` with its HF sources, in HF order (embedding, layers, norm, head)."""
    check_supported(model)
    yield Rule("embedding.word_embeddings.weight", ("model.embed_tokens.weight",))
    for layer in range(model.num_layers):
        yield from _layer_rules(model, layer)
    yield Rule("decoder.final_layernorm.weight", ("model.norm.weight",))
    # Tied: a pipeline's last stage keeps its own copy of the embedding as the output layer.
    yield Rule("output_layer.weight", ("model.embed_tokens.weight" if model.tie_word_embeddings else "lm_head.weight",))


def rule_table(model: ModelConfig) -> dict[str, Rule]:
    return {rule.megatron: rule for rule in rules(model)}


def _qkv_dims(model: ModelConfig) -> tuple[int, int, int]:
    groups = model.num_query_groups
    return groups, model.num_attention_heads // groups, model.kv_channels


def to_megatron(model: ModelConfig, rule: Rule, read: Callable[[str], torch.Tensor]) -> torch.Tensor:
    """The megatron tensor of `rule` from HF tensors (`read(hf_name)`); layouts per the module docstring."""
    parts = [read(name) for name in rule.hf]
    if rule.layout == "copy":
        return parts[0]
    if rule.layout == "glu":
        return torch.cat(parts, dim=0)
    groups, q_per_group, dim = _qkv_dims(model)
    q, k, v = parts
    tail = q.shape[1:]
    grouped = torch.cat(
        [
            q.reshape(groups, q_per_group * dim, *tail),
            k.reshape(groups, dim, *tail),
            v.reshape(groups, dim, *tail),
        ],
        dim=1,
    )
    return grouped.reshape(groups * (q_per_group + 2) * dim, *tail)


def to_hf(model: ModelConfig, rule: Rule, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The HF tensors of `rule` from its whole megatron tensor (inverse of `to_megatron`)."""
    if rule.layout == "copy":
        return [(rule.hf[0], tensor)]
    if rule.layout == "glu":
        gate, up = tensor.chunk(2, dim=0)
        return [(rule.hf[0], gate), (rule.hf[1], up)]
    groups, q_per_group, dim = _qkv_dims(model)
    tail = tensor.shape[1:]
    q, k, v = tensor.reshape(groups, (q_per_group + 2) * dim, *tail).split([q_per_group * dim, dim, dim], dim=1)
    return [
        (rule.hf[0], q.reshape(groups * q_per_group * dim, *tail)),
        (rule.hf[1], k.reshape(groups * dim, *tail)),
        (rule.hf[2], v.reshape(groups * dim, *tail)),
    ]


def hf_names(model: ModelConfig) -> list[str]:
    """Every tensor name of the HF checkpoint of `model` (lm_head only when untied)."""
    names = [name for rule in rules(model) for name in rule.hf]
    return list(dict.fromkeys(names))


def hf_shape(model: ModelConfig, hf_name: str) -> tuple[int, ...]:
    """The shape of HF tensor `hf_name` of `model` (receivers of a broadcast allocate it)."""
    h, d = model.hidden_size, model.kv_channels
    q, kv = model.num_attention_heads * d, model.num_query_groups * d
    ffn = model.ffn_hidden_size
    if ".mlp.experts." in hf_name:
        ffn = model.moe_ffn_hidden_size
    elif ".mlp.shared_expert." in hf_name or ".mlp.shared_experts." in hf_name:
        ffn = model.moe_shared_expert_intermediate_size
    shapes = {
        "embed_tokens.weight": (model.vocab_size, h),
        "lm_head.weight": (model.vocab_size, h),
        "layernorm.weight": (h,),
        "model.norm.weight": (h,),
        "q_norm.weight": (d,),
        "k_norm.weight": (d,),
        "q_proj.weight": (q, h),
        "k_proj.weight": (kv, h),
        "v_proj.weight": (kv, h),
        "q_proj.bias": (q,),
        "k_proj.bias": (kv,),
        "v_proj.bias": (kv,),
        "o_proj.weight": (h, q),
        "gate_proj.weight": (ffn, h),
        "up_proj.weight": (ffn, h),
        "down_proj.weight": (h, ffn),
        "mlp.gate.weight": (model.num_experts, h),
        "mlp.gate.e_score_correction_bias": (model.num_experts,),
        "shared_expert_gate.weight": (1, h),
    }
    if FAMILIES[model.architecture].mla:
        latent = _latent_attention_shapes(model)  # first: `q_a_layernorm` before `layernorm`, its `o_proj` wins
        shapes = {**latent, **{suffix: shape for suffix, shape in shapes.items() if suffix not in latent}}
    for suffix, shape in shapes.items():
        if hf_name.endswith(suffix):
            return shape
    raise KeyError(f"no shape known for HF tensor {hf_name!r}")


def _latent_attention_shapes(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    heads, h = model.num_attention_heads, model.hidden_size
    q_head = model.qk_head_dim + model.qk_pos_emb_head_dim
    return {
        "self_attn.q_proj.weight": (heads * q_head, h),
        "q_a_proj.weight": (model.q_lora_rank, h),
        "q_a_layernorm.weight": (model.q_lora_rank,),
        "q_b_proj.weight": (heads * q_head, model.q_lora_rank),
        "kv_a_proj_with_mqa.weight": (model.kv_lora_rank + model.qk_pos_emb_head_dim, h),
        "kv_a_layernorm.weight": (model.kv_lora_rank,),
        "kv_b_proj.weight": (heads * (model.qk_head_dim + model.v_head_dim), model.kv_lora_rank),
        "o_proj.weight": (h, heads * model.v_head_dim),
    }
