"""`model` config <-> an HF `config.json`, per family (`model.architecture`), both directions.

`hf_fields(model)` writes the transformers config of a model option (tiny models created by code, test
checkpoints); `model_fields_from_hf(config)` reads a downloaded `config.json` back into `ModelConfig`
field values (the converter tools build their model from it); `mismatches(model, config)` lists every
architecture field where the two disagree (validation exits 2 naming each one).

HF spellings absorbed here: transformers 5 moves `rope_theta`/`rope_scaling` into `rope_parameters` and
writes `num_local_experts` for Qwen3-MoE's `num_experts`; keys a file omits take the transformers class
default of that family (`_HF_DEFAULTS`). Torch-free: validation imports it before anything heavy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from slime.config.problems import Problem
from slime.config.schema import ModelConfig
from slime.config.schema_vision import VisionConfig
from slime.models.hf_vision import check_vision, nested_vision_fields, text_fields, vision_fields, vision_mismatches
from slime.registry import MODEL_FAMILIES


@dataclasses.dataclass(frozen=True)
class Family:
    """What an HF model type implies beyond its config.json keys."""

    hf_class: str
    qk_layernorm: bool | None  # per-head RMSNorm on q and k, fixed by the architecture; None: read `use_qk_norm`
    qkv_bias: bool | None  # fixed by the architecture (Qwen2), or None: read `attention_bias`
    moe: bool
    # GLM-4.5 / DeepSeek-V3 MoE: n_routed_experts and n_shared_experts of moe_intermediate_size, dense first layers
    # (first_k_dense_replace), a sigmoid router with expert-score bias, routed_scaling_factor, grouped top-k
    grouped_moe: bool = False
    mla: bool = False  # multi-head latent attention (q_lora_rank, kv_lora_rank, qk_{nope,rope}_head_dim, v_head_dim)
    norms_per_layer: int = 2  # RMSNorms of hidden width per decoder layer (GLM-4 also normalises both outputs)
    no_megatron: str | None = None  # why the megatron backend cannot build it; None: megatron-core's GPT layer spec
    vision: bool = False  # a vision-language model: `model.vision` is its vision tower (slime.models.hf_vision)

    @property
    def megatron(self) -> bool:
        return self.no_megatron is None


class Families(Mapping[str, Family]):
    """The model families by name (`model.architecture`): slime.registry.MODEL_FAMILIES, whose records
    slime/models/spec.py declares, read as their `Family` facts; sorted by name."""

    def __getitem__(self, name: object) -> Family:
        if not isinstance(name, str) or name not in MODEL_FAMILIES.names():
            raise KeyError(name)
        return MODEL_FAMILIES.facts(name)

    def __iter__(self) -> Iterator[str]:
        return iter(MODEL_FAMILIES.names())

    def __len__(self) -> int:
        return len(MODEL_FAMILIES.names())


FAMILIES = Families()

# transformers' class defaults for keys a config.json may omit (per model_type where they differ)
_HF_DEFAULTS = {
    "tie_word_embeddings": {"*": False},
    "attention_bias": {"glm4": True, "*": False},
    "partial_rotary_factor": {"glm4": 0.5, "glm4_moe": 0.5, "*": 1.0},
    "norm_topk_prob": {"*": False},
    "router_aux_loss_coef": {"*": 0.001},
    "rms_norm_eps": {"glm4": 1.5625e-07, "glm4_moe": 1e-5, "*": 1e-6},
    "use_qk_norm": {"*": False},
}
# The grouped MoE families' router keys and MLA's, with their transformers class defaults (Glm4MoeConfig,
# DeepseekV3Config) for a config.json that omits one
GROUPED_MOE_KEYS = {
    "moe_first_dense_layers": ("first_k_dense_replace", {"glm4_moe": 1, "deepseek_v3": 3}),
    "moe_routed_scaling_factor": ("routed_scaling_factor", {"glm4_moe": 1.0, "deepseek_v3": 2.5}),
    "moe_router_num_groups": ("n_group", {"glm4_moe": 1, "deepseek_v3": 8}),
    "moe_router_group_topk": ("topk_group", {"glm4_moe": 1, "deepseek_v3": 4}),
}
MLA_KEYS = {
    "q_lora_rank": ("q_lora_rank", 1536),
    "kv_lora_rank": ("kv_lora_rank", 512),
    "qk_head_dim": ("qk_nope_head_dim", 128),
    "qk_pos_emb_head_dim": ("qk_rope_head_dim", 64),
    "v_head_dim": ("v_head_dim", 128),
}

# ModelConfig field -> HF key, for fields that are a plain copy
_PLAIN = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "ffn_hidden_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "max_position_embeddings",
}
_MOE = {
    "num_experts": "num_experts",
    "moe_router_topk": "num_experts_per_tok",
    "moe_ffn_hidden_size": "moe_intermediate_size",
    "moe_norm_topk_prob": "norm_topk_prob",
    "moe_aux_loss_coeff": "router_aux_loss_coef",
}

# Fields compared with a checkpoint. Not compared: max_position_embeddings (packed training does not use
# it; raising it for long contexts is legitimate), moe_aux_loss_coeff (a training knob), init_* (creation).
CHECKED = (
    "architecture",
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "vocab_size",
    "norm_epsilon",
    "rotary_base",
    "tie_word_embeddings",
    "qk_layernorm",
    "add_qkv_bias",
    "rotary_percent",
    "rope_scaling",
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_norm_topk_prob",
    *GROUPED_MOE_KEYS,
    *MLA_KEYS,
)


def _default(key: str, model_type: str) -> Any:
    table = _HF_DEFAULTS[key]
    return table.get(model_type, table["*"])


# Keys transformers 5 keeps in `rope_parameters` that are not a scaling (model.rotary_base, model.rotary_percent)
_ROPE_NOT_SCALING = ("rope_theta", "partial_rotary_factor")


def normalize_rope_scaling(scaling: dict | None) -> dict | None:
    """HF rope scaling without `rope_theta` and `partial_rotary_factor`, with `type` spelled `rope_type`; None for
    plain RoPE."""
    if not scaling:
        return None
    if "mrope_section" in scaling:  # Qwen-VL's multimodal RoPE, spelled "type": "mrope" or beside rope_type default
        return {"mrope_section": list(scaling["mrope_section"])}
    out = {("rope_type" if k == "type" else k): v for k, v in scaling.items() if k not in _ROPE_NOT_SCALING}
    if out.get("rope_type", "default") == "default" and set(out) <= {"rope_type"}:
        return None
    return out


def hf_fields(model: ModelConfig, *, eos_token_id: int | None, pad_token_id: int | None) -> dict:
    """The transformers `config.json` fields for `model` (any family of FAMILIES)."""
    family = _family(model.architecture)
    fields = {"architectures": [family.hf_class], "model_type": model.architecture}
    fields.update({hf: getattr(model, ours) for ours, hf in _PLAIN.items()})
    fields.update(
        num_key_value_heads=model.num_query_groups,
        head_dim=model.kv_channels,
        rms_norm_eps=model.norm_epsilon,
        rope_theta=model.rotary_base,
        tie_word_embeddings=model.tie_word_embeddings,
        hidden_act="silu",
        initializer_range=model.init_std,
        slime_init_seed=model.init_seed,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    if family.qkv_bias is None:
        fields["attention_bias"] = model.add_qkv_bias
    if model.rotary_percent != 1.0 or _default("partial_rotary_factor", model.architecture) != 1.0:
        fields["partial_rotary_factor"] = model.rotary_percent
    if model.rope_scaling is not None:
        fields["rope_scaling"] = dict(model.rope_scaling)
    if family.qk_layernorm is None:
        fields["use_qk_norm"] = model.qk_layernorm
    if family.moe and not family.grouped_moe:
        fields.update({hf: getattr(model, ours) for ours, hf in _MOE.items()})
        fields.update(decoder_sparse_step=1, mlp_only_layers=[])
    if family.grouped_moe:
        fields.update(_grouped_moe_fields(model))
    if family.mla:
        fields.update({hf: getattr(model, ours) for ours, (hf, _) in MLA_KEYS.items()})
        fields.update(num_key_value_heads=model.num_attention_heads, attention_bias=False)
    if family.vision:
        return nested_vision_fields(fields, model)
    return fields


def _grouped_moe_fields(model: ModelConfig) -> dict:
    """GLM-4.5 / DeepSeek-V3's MoE keys: the shared experts as a count of routed-expert widths."""
    shared = model.moe_shared_expert_intermediate_size or 0
    fields = {hf: getattr(model, ours) for ours, (hf, _) in GROUPED_MOE_KEYS.items()}
    return fields | {
        "n_routed_experts": model.num_experts,
        "num_experts_per_tok": model.moe_router_topk,
        "moe_intermediate_size": model.moe_ffn_hidden_size,
        "n_shared_experts": shared // model.moe_ffn_hidden_size,
        "norm_topk_prob": model.moe_norm_topk_prob,
    }


def model_fields_from_hf(config: dict) -> dict[str, Any]:
    """ModelConfig field values read from an HF `config.json` dict (architecture fields only)."""
    model_type = config.get("model_type")
    family = _family(model_type)
    fields: dict[str, Any] = {"architecture": model_type}
    if family.vision:
        fields["vision"] = VisionConfig(**vision_fields(config))
        config = text_fields(config)
    fields.update({ours: config[hf] for ours, hf in _PLAIN.items() if hf in config})
    heads = config["num_attention_heads"]
    fields["num_query_groups"] = config.get("num_key_value_heads") or heads
    fields["kv_channels"] = config.get("head_dim") or config["hidden_size"] // heads
    fields["norm_epsilon"] = config.get("rms_norm_eps", _default("rms_norm_eps", model_type))
    rope = config.get("rope_parameters") or {}
    fields["rotary_base"] = float(config.get("rope_theta", rope.get("rope_theta", 10000.0)))
    fields["rope_scaling"] = normalize_rope_scaling(config.get("rope_scaling") or rope)
    fields["tie_word_embeddings"] = config.get("tie_word_embeddings", _default("tie_word_embeddings", model_type))
    fields["qk_layernorm"] = (
        family.qk_layernorm
        if family.qk_layernorm is not None
        else config.get("use_qk_norm", _default("use_qk_norm", model_type))
    )
    fields["add_qkv_bias"] = (
        family.qkv_bias
        if family.qkv_bias is not None
        else config.get("attention_bias", _default("attention_bias", model_type))
    )
    fields["rotary_percent"] = config.get(
        "partial_rotary_factor", rope.get("partial_rotary_factor", _default("partial_rotary_factor", model_type))
    )
    fields["num_experts"] = None
    fields["moe_shared_expert_intermediate_size"] = config.get("shared_expert_intermediate_size")
    if family.moe and not family.grouped_moe:
        config = {"num_experts": config.get("num_local_experts"), **config}
        for ours, hf in _MOE.items():
            fields[ours] = config.get(hf, _HF_DEFAULTS.get(hf, {}).get("*"))
    if family.grouped_moe:
        fields.update(_grouped_moe_from_hf(config, model_type))
    if family.mla:
        fields.update({ours: config.get(hf, default) for ours, (hf, default) in MLA_KEYS.items()})
        fields["kv_channels"] = fields["qk_pos_emb_head_dim"]  # DeepseekV3Config's head_dim; the file has none
    return fields


def _grouped_moe_from_hf(config: dict, model_type: str) -> dict[str, Any]:
    routed_width = config.get("moe_intermediate_size")
    fields: dict[str, Any] = {
        "num_experts": config.get("n_routed_experts"),
        "moe_router_topk": config.get("num_experts_per_tok"),
        "moe_ffn_hidden_size": routed_width,
        "moe_shared_expert_intermediate_size": (config.get("n_shared_experts") or 0) * routed_width or None,
        "moe_norm_topk_prob": config.get("norm_topk_prob", True),
    }
    for ours, (hf, defaults) in GROUPED_MOE_KEYS.items():
        fields[ours] = config.get(hf, defaults[model_type])
    return fields


def unsupported_layout(config: dict) -> str | None:
    """Why an MoE config.json has a layer layout we cannot build (dense layers between MoE ones), or None."""
    sparse_step = config.get("decoder_sparse_step", 1)
    dense_layers = config.get("mlp_only_layers") or []
    if config.get("model_type") == "qwen3_moe" and (sparse_step != 1 or dense_layers):
        return (
            f"decoder_sparse_step={sparse_step}, mlp_only_layers={dense_layers}: "
            "only checkpoints whose every layer is an MoE layer are supported"
        )
    return None


def mismatches(model: ModelConfig, config: dict) -> list[tuple[str, Any, Any]]:
    """(field, our value, checkpoint's value) for every CHECKED field that differs; a checkpoint of an
    unknown model type differs in `architecture` only."""
    if config.get("model_type") not in FAMILIES:
        return [("architecture", model.architecture, config.get("model_type"))]
    theirs = model_fields_from_hf(config)
    out = vision_mismatches(model.vision, config)
    for name in CHECKED:
        if name not in theirs:
            continue  # MoE router knobs of a dense checkpoint
        ours = getattr(model, name)
        if name == "rope_scaling":
            ours = normalize_rope_scaling(ours)
        if ours != theirs[name] and not _close(ours, theirs[name]):
            out.append((name, ours, theirs[name]))
    return out


def _close(a: Any, b: Any) -> bool:
    """Floats written by JSON round trips (1e-06 vs 1.0e-6) compare equal."""
    return isinstance(a, float | int) and isinstance(b, float | int) and abs(a - b) <= 1e-12 * max(abs(a), abs(b))


def _family(architecture: str | None) -> Family:
    if architecture not in FAMILIES:
        raise ValueError(f"model.architecture={architecture!r}: not one of {sorted(FAMILIES)}")
    return FAMILIES[architecture]


def check_model(model: ModelConfig) -> Iterator[Problem]:
    """Fields that contradict the family (`model.architecture`) or each other (the megatron backend's check,
    slime/train/megatron/config_check.py, adds the families it has no layer spec for)."""
    if model.architecture not in FAMILIES:
        return  # reported by check_choices
    family = FAMILIES[model.architecture]
    arch = f"model.architecture={model.architecture}"
    if family.qk_layernorm is not None and model.qk_layernorm != family.qk_layernorm:
        yield Problem("model.qk_layernorm", model.qk_layernorm, f"{arch} implies {family.qk_layernorm}", "drop it")
    if family.qkv_bias is not None and model.add_qkv_bias != family.qkv_bias:
        yield Problem("model.add_qkv_bias", model.add_qkv_bias, f"{arch} implies {family.qkv_bias}", "drop it")
    if model.num_query_groups <= 0 or model.num_attention_heads % model.num_query_groups:
        yield Problem(
            "model.num_query_groups",
            model.num_query_groups,
            f"must divide model.num_attention_heads={model.num_attention_heads}",
            "set it to the checkpoint's num_key_value_heads",
        )
    if not 0 < model.rotary_percent <= 1:
        yield Problem("model.rotary_percent", model.rotary_percent, "must be in (0, 1]", "set model.rotary_percent=1.0")
    yield from check_vision(model, vision_family=family.vision)
    if model.rope_scaling is not None and not isinstance(model.rope_scaling, dict):
        yield Problem(
            "model.rope_scaling",
            model.rope_scaling,
            "HF config.json's rope_scaling is a dict (rope_type, factor, ...)",
            "set model.rope_scaling={rope_type: yarn, factor: 4.0, ...} or null",
        )
    if not family.moe:
        if model.num_experts is not None:
            yield Problem("model.num_experts", model.num_experts, f"{arch} is dense", "set model.num_experts=null")
        return
    for key in ("num_experts", "moe_ffn_hidden_size"):
        if getattr(model, key) is None or getattr(model, key) <= 0:
            yield Problem(f"model.{key}", getattr(model, key), f"{arch} needs it > 0", f"set model.{key}=<HF value>")
    if model.num_experts and not 1 <= model.moe_router_topk <= model.num_experts:
        yield Problem(
            "model.moe_router_topk",
            model.moe_router_topk,
            f"must be in [1, model.num_experts={model.num_experts}]",
            "set it to the checkpoint's num_experts_per_tok",
        )
