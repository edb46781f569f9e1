"""HF <-> megatron tensor layouts and tensor-parallel split math, on whole tensors (no processes)."""

from __future__ import annotations

import pytest
import torch

from slime.train.megatron.weights import names, sharding
from slime.train.megatron.weights.hf_reader import HFReader
from tests.helpers.megatron_checkpoints import FAMILIES, make_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {family: make_checkpoint(family, root) for family in FAMILIES}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_to_megatron_to_hf_is_bit_exact_and_covers_every_tensor(checkpoints, family):
    model = checkpoints[family]
    reader = HFReader(model.hf_checkpoint)
    assert set(names.hf_names(model)) == reader.names()
    back = {}
    for rule in names.rules(model):
        whole = names.to_megatron(model, rule, reader.get)
        back.update(names.to_hf(model, rule, whole))
    for name in reader.names():
        assert torch.equal(back[name], reader.get(name)), name
        assert tuple(reader.get(name).shape) == names.hf_shape(model, name)


def test_qkv_rows_are_grouped_by_query_group(checkpoints):
    """Group g of linear_qkv holds its q heads, then its k head, then its v head (bias likewise)."""
    model = checkpoints["qwen2"]  # 4 heads over 2 groups, head dim 16, q/k/v bias
    reader = HFReader(model.hf_checkpoint)
    table = names.rule_table(model)
    d, heads_per_group = model.kv_channels, model.num_attention_heads // model.num_query_groups
    for suffix in ("weight", "bias"):
        qkv = names.to_megatron(model, table[f"decoder.layers.1.self_attention.linear_qkv.{suffix}"], reader.get)
        q, k, v = (reader.get(f"model.layers.1.self_attn.{p}_proj.{suffix}") for p in "qkv")
        for g in range(model.num_query_groups):
            rows = qkv[g * (heads_per_group + 2) * d : (g + 1) * (heads_per_group + 2) * d]
            expected = torch.cat(
                [
                    q[g * heads_per_group * d : (g + 1) * heads_per_group * d],
                    k[g * d : (g + 1) * d],
                    v[g * d : (g + 1) * d],
                ]
            )
            assert torch.equal(rows, expected)


def test_tensor_parallel_shards(checkpoints):
    """TP=2: qkv shards hold whole query groups, fc1 shards [gate half; up half], row layouts split columns,
    and every layout reassembles exactly."""
    model = checkpoints["qwen2"]
    reader = HFReader(model.hf_checkpoint)
    table = names.rule_table(model)
    qkv = names.to_megatron(model, table["decoder.layers.0.self_attention.linear_qkv.weight"], reader.get)
    rows_per_group = qkv.shape[0] // model.num_query_groups
    fc1 = names.to_megatron(model, table["decoder.layers.0.mlp.linear_fc1.weight"], reader.get)
    gate, up = (reader.get(f"model.layers.0.mlp.{p}_proj.weight") for p in ("gate", "up"))
    half = model.ffn_hidden_size // 2
    for r in range(2):
        assert torch.equal(sharding.shard(qkv, "column", r, 2), qkv[r * rows_per_group : (r + 1) * rows_per_group])
        assert torch.equal(
            sharding.shard(fc1, "glu", r, 2),
            torch.cat([gate[r * half : (r + 1) * half], up[r * half : (r + 1) * half]]),
        )
    for rule in names.rules(model):
        whole = names.to_megatron(model, rule, reader.get)
        layout = sharding.tp_layout(rule.megatron)
        if layout == "vocab":
            whole = sharding.pad_rows(whole, sharding.padded_vocab_size(model.vocab_size, 2))
        parts = [sharding.shard(whole, layout, r, 2) for r in range(2)]
        if layout == "row":
            assert parts[0].shape[1] * 2 == whole.shape[1]
        assert torch.equal(sharding.unshard(parts, layout), whole), rule.megatron


def test_layouts_of_names_and_vocab_padding():
    assert [sharding.padded_vocab_size(151936, tp) for tp in (1, 2, 4, 8)] == [151936, 152064, 152064, 152576]
    assert sharding.tp_layout("decoder.layers.3.mlp.experts.local_experts.7.linear_fc1.weight") == "glu"
    assert sharding.tp_layout("decoder.layers.3.mlp.router.weight") == "replicated"
    assert sharding.is_expert("decoder.layers.3.mlp.experts.local_experts.7.linear_fc2.weight")
    assert not sharding.is_expert("decoder.layers.3.mlp.shared_experts.linear_fc2.weight")
    assert [sharding.global_expert(1, r, 64) for r in range(3)] == [1, 65, 129]
    assert names.canonical("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight") == (
        "decoder.layers.0.input_layernorm.weight"
    )
    assert names.canonical("decoder.layers.0.mlp.linear_fc1.layer_norm_weight") == (
        "decoder.layers.0.pre_mlp_layernorm.weight"
    )


def test_glm4_has_no_megatron_mapping(checkpoints):
    from dataclasses import replace

    with pytest.raises(ValueError, match="parallelism=fsdp"):
        list(names.rules(replace(checkpoints["qwen2"], architecture="glm4")))
