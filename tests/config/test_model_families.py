"""The model families' shapes (slime.models.shape, slime.models.families): every model option's parameter count is
transformers' own count of the model its config.json builds (a vision-language model's with its vision tower), and
the options of GLM-4.5, DeepSeek-V3, Moonlight, Qwen2.5-VL and Qwen3-VL are within 1% of their published totals."""

from __future__ import annotations

import dataclasses

import pytest

from slime.config.problems import ConfigError
from slime.config.schema import ModelConfig
from slime.models.check import check_family
from slime.models.families import FAMILIES, hf_fields, mismatches
from slime.plan.memory import parameter_count
from slime.plan.validate import collect_problems, validate
from slime.registry import MODEL_FAMILIES, Checks
from tests.helpers.compose import CONF, model_fields, typed_config
from tests.helpers.registry import registered

MODEL_OPTIONS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
PUBLISHED_TOTALS = {  # the model cards' totals (the MTP layers of GLM-4.5 and DeepSeek-V3, not trained, left out)
    "glm4_5": 355e9,
    "glm4_5_air": 106e9,
    "deepseek_v3": 671e9,
    "moonlight_16b_a3b": 16e9,
    "qwen2_5_vl_3b": 3.75e9,  # the vision tower included
    "qwen2_5_vl_7b": 8.29e9,
    "qwen3_vl_4b": 4.44e9,  # the model cards' 4.44B and 8.77B
    "qwen3_vl_8b": 8.77e9,
}


def _transformers_count(model: ModelConfig) -> int:
    """Parameters of the transformers model of `model`'s config.json, built on the meta device (no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.for_model(**hf_fields(model, eos_token_id=0, pad_token_id=0))
    auto = AutoModelForImageTextToText if model.vision is not None else AutoModelForCausalLM
    with torch.device("meta"):
        built = auto.from_config(config)
    return sum(p.numel() for p in built.parameters())


@pytest.mark.parametrize("option", MODEL_OPTIONS)
def test_the_parameter_count_is_transformers_count_of_the_same_config(option):
    cfg = typed_config([f"model={option}"])
    assert parameter_count(cfg)[0] == _transformers_count(cfg.model)


@pytest.mark.parametrize("option,published", PUBLISHED_TOTALS.items())
def test_the_new_families_options_match_their_published_totals(option, published):
    total = parameter_count(typed_config([f"model={option}"]))[0]
    assert abs(total / published - 1) < 0.01, total


@pytest.mark.parametrize(
    "overrides,key,words",
    [
        (["model.kv_lora_rank=16"], "model.kv_lora_rank", "has no latent attention"),
        (["model.rope_scaling=7"], "model.rope_scaling", "rope_scaling is a dict"),
        (["model.moe_first_dense_layers=1"], "model.moe_first_dense_layers", "has no such router"),
        (["model=tiny_deepseek_v3", "model.kv_channels=16"], "model.kv_channels", "model.kv_channels=8"),
        (["model=tiny_deepseek_v3", "model.num_query_groups=2"], "model.num_query_groups", "num_key_value_heads"),
        (["model=tiny_deepseek_v3", "model.v_head_dim=null"], "model.v_head_dim", "needs it > 0"),
        (["model=tiny_deepseek_v3", "model.moe_router_num_groups=3"], "model.moe_router_group_topk", "must divide"),
        (["model=tiny_glm4_moe", "model.moe_first_dense_layers=3"], "model.moe_first_dense_layers", "[0, model"),
        (["model=tiny_glm4_moe", "model.moe_shared_expert_intermediate_size=40"], "model.moe_shared", "multiple of 32"),
        (["model=tiny_deepseek_v3", "model.lora.rank=8"], "model.lora.rank", "multi-head latent attention"),
        (["model=tiny_glm4_moe", "parallelism=megatron", "model.moe_norm_topk_prob=false"], "model.moe_norm", "renorm"),
        (
            ["model=glm4_5", "parallelism=megatron", "model.moe_router_num_groups=4", "model.moe_router_group_topk=2"],
            "model.moe_router_group_topk",
            "by its top 2",
        ),
        (["model=tiny_deepseek_v3", "parallelism=megatron", "parallelism.cp=2"], "parallelism.cp", "rotates its own"),
        (["model=tiny_deepseek_v3", "parallelism=megatron", "parallelism.tp=2"], "parallelism.tp", "latent attention"),
        (
            ["model=tiny_glm4_moe", "parallelism=megatron", "parallelism.tp=2", "parallelism.sequence_parallel=true"],
            "parallelism.etp",
            "sums the experts' gradients over the data-parallel ranks only",
        ),
    ],
)
def test_the_new_families_rules_name_the_key(overrides, key, words):
    with pytest.raises(ConfigError) as info:
        validate(typed_config(["cluster.ray_address=auto", *overrides]))
    found = [(p.key, str(p)) for p in info.value.problems]
    assert any(k.startswith(key) and words in message for k, message in found), found


def test_glm4_5_reads_back_from_its_config_json_spelling():
    """GLM-4.5's config.json names (n_routed_experts, n_shared_experts, first_k_dense_replace, use_qk_norm) are ours."""
    fields = hf_fields(ModelConfig(**{**model_fields("glm4_5"), "hf_checkpoint": "/x"}), eos_token_id=0, pad_token_id=0)
    assert (fields["n_routed_experts"], fields["n_shared_experts"], fields["first_k_dense_replace"]) == (160, 1, 3)
    assert (fields["use_qk_norm"], fields["attention_bias"], fields["partial_rotary_factor"]) == (True, True, 0.5)
    assert (fields["n_group"], fields["topk_group"], fields["routed_scaling_factor"]) == (1, 1, 2.5)


def test_model_flops_count_latent_attention_and_the_dense_first_layer():
    """tiny_deepseek_v3 by hand: attention weights q 32·(64 + 4·24) + latent 64·(16 + 8) + up 16·4·(16 + 16) + o
    4·16·64 = 12800 a layer; FFN widths 192 (the dense layer) + 2·32 + 32 (the MoE layer: top-2 and the shared);
    scores and values 4 heads · (24 + 16) · S a layer."""
    from slime.models.flops import layer_flops_per_token

    model = typed_config(["model=tiny_deepseek_v3"]).model
    assert layer_flops_per_token(model, 10) == 2 * 2 * 12800 + 6 * 64 * (192 + 96) + 2 * 4 * 40 * 10


def test_deepseek_v3s_published_config_json_matches_the_option():
    """deepseek-ai/DeepSeek-V3's config.json as published: no head_dim (transformers derives it from qk_rope_head_dim),
    `rope_scaling` spelled with `type`, the MTP layer's key; it matches model=deepseek_v3 field for field."""
    published = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "qk_nope_head_dim": 128,
        "topk_method": "noaux_tc",
        "n_group": 8,
        "topk_group": 4,
        "num_experts_per_tok": 8,
        "moe_layer_freq": 1,
        "first_k_dense_replace": 3,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": 129280,
    }
    option = ModelConfig(**{**model_fields("deepseek_v3"), "hf_checkpoint": "/x"})
    assert mismatches(option, published) == []
    assert mismatches(dataclasses.replace(option, moe_router_group_topk=2), published) == [
        ("moe_router_group_topk", 2, 4)
    ]


def test_a_glm4_5_config_json_as_transformers_5_writes_it_matches():
    """transformers 5 saves partial_rotary_factor inside rope_parameters (beside rope_theta): it is
    model.rotary_percent, not a RoPE scaling."""
    model = ModelConfig(**{**model_fields("glm4_5"), "hf_checkpoint": "/x"})
    published = hf_fields(model, eos_token_id=0, pad_token_id=0)
    rewritten = {k: v for k, v in published.items() if k not in ("rope_theta", "partial_rotary_factor")}
    rewritten["rope_parameters"] = {"rope_type": "default", "rope_theta": published["rope_theta"]}
    rewritten["rope_parameters"]["partial_rotary_factor"] = 0.5
    assert mismatches(model, published) == [] and mismatches(model, rewritten) == []
    rewritten["rope_parameters"]["partial_rotary_factor"] = 1.0
    assert mismatches(model, rewritten) == [("rotary_percent", 0.5, 1.0)]


def test_a_rope_scaling_dict_on_the_command_line_lands_as_given():
    """Over an option's `rope_scaling: null` (omegaconf could not merge a dict into a None Optional[dict] node)."""
    cfg = typed_config(["model.rope_scaling={rope_type:yarn,factor:4.0,original_max_position_embeddings:128}"])
    assert cfg.model.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    assert typed_config(["model=tiny_deepseek_v3", "model.rope_scaling.factor=8.0"]).model.rope_scaling["factor"] == 8.0


def test_the_families_are_the_registrys_records(monkeypatch):
    """FAMILIES reads slime.registry.MODEL_FAMILIES (slime/models/spec.py): each record's facts are its Family and its
    check is the family check; a family registered there is one validation accepts and checks."""
    assert list(FAMILIES) == MODEL_FAMILIES.names() and "qwen3_moe" in FAMILIES and None not in FAMILIES
    assert FAMILIES["qwen3"] is MODEL_FAMILIES.facts("qwen3") and FAMILIES.get("qwen9") is None
    assert MODEL_FAMILIES.checks("qwen3") == Checks(check=check_family)
    registered(
        monkeypatch,
        MODEL_FAMILIES,
        "qwen3_copy",
        "transformers.Qwen3ForCausalLM",
        facts=FAMILIES["qwen3"],
        checks=Checks(check=check_family),
    )
    found = {p.key: str(p) for p in collect_problems(typed_config(["model.architecture=qwen3_copy"]))}
    assert "model.architecture" not in found
    found = {
        p.key for p in collect_problems(typed_config(["model.architecture=qwen3_copy", "model.qk_layernorm=false"]))
    }
    assert "model.qk_layernorm" in found
