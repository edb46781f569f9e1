"""The hf engine's strict loader and the layout every weight-sync bucket loads through."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from slime.engine.hf.weights import StateLayout, WeightLoadError, load_weights_strict, read_safetensors_dir
from tests.helpers.megatron_checkpoints import make_checkpoint, with_random_expert_bias


@pytest.fixture()
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config)
    model.model.register_buffer("scale", torch.ones(3))  # a persistent buffer: a checkpoint name, not a parameter
    return model


def test_a_layout_built_before_the_model_moved_loads_into_the_moved_tensors(model):
    """Memory release moves the model (`model.to`), which replaces parameter data and buffers: a layout that kept
    the tensors themselves would load into the old ones."""
    layout = StateLayout(model)
    model.to(torch.float64)
    norm = torch.full((16,), 0.25)
    count = load_weights_strict(model, {"model.norm.weight": norm, "model.scale": torch.full((3,), 2.0)},
                                partial=True, layout=layout)  # fmt: skip
    assert count == 2
    state = model.state_dict()
    assert state["model.norm.weight"].dtype == torch.float64 and torch.equal(state["model.norm.weight"], norm.double())
    assert torch.equal(state["model.scale"], torch.full((3,), 2.0, dtype=torch.float64))


def test_a_tied_alias_is_checked_not_copied_and_every_problem_is_named_before_any_copy(model):
    layout = StateLayout(model)
    assert layout.aliases == {"lm_head.weight"} and "model.scale" in layout.primary
    embed = torch.randn(64, 16)
    assert load_weights_strict(model, {"model.embed_tokens.weight": embed, "lm_head.weight": -embed},
                               partial=True, layout=layout) == 1  # fmt: skip
    assert torch.equal(model.lm_head.weight, embed)

    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    bad = {"model.norm.weight": torch.zeros(16), "model.nope": torch.zeros(1), "lm_head.weight": torch.zeros(8, 16)}
    with pytest.raises(WeightLoadError) as refused:
        load_weights_strict(model, bad, layout=layout)
    message = str(refused.value)
    assert "missing tensors: lm_head.weight" not in message  # an alias is optional
    assert "missing tensors: model.embed_tokens.weight" in message and "unexpected tensors: model.nope" in message
    assert "lm_head.weight: checkpoint (8, 16) vs model (64, 16)" in message
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


@pytest.mark.parametrize("family", ["qwen3_moe", "glm4_moe"])
def test_a_moe_model_loads_its_checkpoints_tensors_per_expert_into_its_fused_experts(family, tmp_path):
    """transformers holds a MoE layer's experts fused (`mlp.experts.gate_up_proj` [E, 2I, H]); a bucket carries
    the checkpoint's names, one tensor per expert, as SGLang, vLLM and megatron's export name them."""
    source = make_checkpoint(family, tmp_path)
    with_random_expert_bias(source)
    tensors = read_safetensors_dir(source.hf_checkpoint)
    assert "model.layers.1.mlp.experts.3.gate_proj.weight" in tensors
    reference = AutoModelForCausalLM.from_pretrained(source.hf_checkpoint)
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(reference.config)  # other weights, the same fused layout
    assert "model.layers.1.mlp.experts.gate_up_proj" in model.state_dict()
    layout = StateLayout(model)
    assert layout.primary == set(tensors) and not layout.aliases

    names = sorted(tensors)
    for half in (names[::2], names[1::2]):  # experts of one layer split across buckets
        load_weights_strict(model, {name: tensors[name] for name in half}, partial=True, layout=layout)
    loaded = model.state_dict()
    assert all(torch.equal(loaded[name], value) for name, value in reference.state_dict().items())


def test_a_wrong_expert_tensor_is_named_and_nothing_is_copied(tmp_path):
    source = make_checkpoint("glm4_moe", tmp_path)
    tensors = read_safetensors_dir(source.hf_checkpoint)
    model = AutoModelForCausalLM.from_pretrained(source.hf_checkpoint)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    bad = {name: torch.zeros_like(value) for name, value in tensors.items()}
    bad["model.layers.1.mlp.experts.2.up_proj.weight"] = torch.zeros(31, 64)
    with pytest.raises(
        WeightLoadError, match=r"experts\.2\.up_proj\.weight: checkpoint \(31, 64\) vs model \(32, 64\)"
    ):
        load_weights_strict(model, bad)
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
