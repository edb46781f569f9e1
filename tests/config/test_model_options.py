"""Model options against HF config.json files: both translations, the checkpoint check, the family rules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from slime.config.schema import ModelConfig
from slime.models.families import hf_fields, mismatches, model_fields_from_hf
from tests.helpers.compose import CONF, ROOT, fake_hf_dir, model_fields
from tests.helpers.validation import config_problems

MODEL_OPTIONS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))


@pytest.mark.parametrize("option", MODEL_OPTIONS)
def test_hf_fields_read_back_to_the_option(option):
    model = ModelConfig(**model_fields(option))
    read = model_fields_from_hf(hf_fields(model, eos_token_id=0, pad_token_id=0))
    assert {k: v for k, v in read.items() if getattr(model, k) != v} == {}
    assert mismatches(model, hf_fields(model, eos_token_id=0, pad_token_id=0)) == []


def test_downloaded_config_spellings_are_understood():
    """Llama-3.1-8B's config.json as published (rope_scaling with `rope_type`, no head_dim) and the same file as
    transformers 5 rewrites it (rope_parameters) both match llama3_8b plus the 3.1 overrides."""
    scaling = {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }
    published = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": scaling,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "max_position_embeddings": 131072,
    }
    rewritten = {k: v for k, v in published.items() if k not in ("rope_theta", "rope_scaling")}
    rewritten["rope_parameters"] = {**scaling, "rope_theta": 500000.0}
    model = ModelConfig(**{**model_fields("llama3_8b"), "rope_scaling": scaling, "max_position_embeddings": 131072})
    assert mismatches(model, published) == [] and mismatches(model, rewritten) == []
    plain = ModelConfig(**model_fields("llama3_8b"))
    assert mismatches(plain, published) == [("rope_scaling", None, scaling)]


def test_qwen2_implies_qkv_bias_and_no_qk_norm():
    hf = {"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4}
    fields = model_fields_from_hf(hf)
    assert (fields["add_qkv_bias"], fields["qk_layernorm"], fields["kv_channels"]) == (True, False, 128)


def test_every_mismatching_field_is_named_with_both_values(tmp_path):
    path = fake_hf_dir(tmp_path, "qwen3_30b_a3b")
    config = json.loads((tmp_path / "qwen3_30b_a3b" / "config.json").read_text())
    config.update(num_experts=64, norm_topk_prob=False, tie_word_embeddings=True, head_dim=64)
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (tmp_path / "qwen3_30b_a3b" / "config.json").write_text(json.dumps(config))
    found = config_problems(["model=qwen3_30b_a3b", f"model.hf_checkpoint={path}"])
    expected = {
        "model.num_experts": ("128", "64"),
        "model.moe_norm_topk_prob": ("True", "False"),
        "model.tie_word_embeddings": ("False", "True"),
        "model.kv_channels": ("128", "64"),
        "model.rope_scaling": ("None", "'yarn'"),
    }
    for key, (ours, theirs) in expected.items():
        assert key in found and ours in found[key] and theirs in found[key], (key, found.get(key))
    assert len([k for k in found if k.startswith("model.")]) == len(expected)


def test_checkpoint_of_another_family_and_dense_layers_in_moe(tmp_path):
    path = fake_hf_dir(tmp_path, "qwen3_30b_a3b")
    config = json.loads((tmp_path / "qwen3_30b_a3b" / "config.json").read_text())
    (tmp_path / "qwen3_30b_a3b" / "config.json").write_text(json.dumps({**config, "mlp_only_layers": [0]}))
    found = config_problems(["model=qwen3_30b_a3b", f"model.hf_checkpoint={path}"])
    assert "mlp_only_layers=[0]" in found["model.hf_checkpoint"]
    (tmp_path / "qwen3_30b_a3b" / "config.json").write_text(json.dumps({**config, "model_type": "mixtral"}))
    found = config_problems(["model=qwen3_30b_a3b", f"model.hf_checkpoint={path}"])
    assert "'mixtral'" in found["model.architecture"]


def test_cli_exits_2_on_a_config_json_mismatch(tmp_path):
    path = fake_hf_dir(tmp_path, "qwen2_5_7b")
    proc = subprocess.run(
        [sys.executable, "main.py", "model=qwen2_5_7b", f"model.hf_checkpoint={path}", "model.ffn_hidden_size=18000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "model.ffn_hidden_size=18000" in proc.stderr and "18944" in proc.stderr


@pytest.mark.parametrize(
    "overrides,key,words",
    [
        (["model.architecture=qwen3moe"], "model.architecture", "did you mean qwen3_moe"),
        (["model.architecture=qwen3_moe"], "model.num_experts", "needs it > 0"),
        (["model.num_experts=4"], "model.num_experts", "is dense"),
        (["model.qk_layernorm=false"], "model.qk_layernorm", "implies True"),
        (["model.num_query_groups=3"], "model.num_query_groups", "must divide"),
        (["model=tiny_qwen3_moe", "model.moe_router_topk=5"], "model.moe_router_topk", "[1, model.num_experts=4]"),
        (["model=glm4_9b", "parallelism.backend=megatron"], "model.architecture", "parallelism=fsdp"),
    ],
)
def test_family_rules(overrides, key, words):
    found = config_problems(["cluster.ray_address=auto", *overrides])
    assert words in found[key], found
