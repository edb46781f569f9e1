"""The hf engine's strict loader and the layout every weight-sync bucket loads through."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from slime.engine.hf.weights import StateLayout, WeightLoadError, load_weights_strict


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
