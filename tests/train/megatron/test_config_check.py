"""Validation of the megatron backend's config: parallelism.megatron against megatron-core's fields, and the
backend's own option rules; all before anything starts (exit 2 through ConfigError)."""

from __future__ import annotations

import importlib

import pytest

from slime.config.problems import ConfigError
from slime.plan.validate import validate
from slime.train.megatron import config_check
from slime.train.megatron.config_check import MEGATRON_OWNED, megatron_config_fields, megatron_problems
from tests.helpers.compose import typed_config

FIELDS = {
    "recompute_granularity": "TransformerConfig",
    "recompute_method": "TransformerConfig",
    "use_distributed_optimizer": "DistributedDataParallelConfig",
    "tensor_model_parallel_size": "ModelParallelConfig",
}


def problems_for(overrides: list[str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        validate(typed_config(overrides))
    return {p.key: str(p) for p in info.value.problems}


def test_megatron_keys_against_a_field_set():
    found = {
        p.key: p.message
        for p in megatron_problems(
            {"recompute_granularity": "full", "recompute_methd": "uniform", "tensor_model_parallel_size": 2}, FIELDS
        )
    }
    assert set(found) == {"parallelism.megatron.recompute_methd", "parallelism.megatron.tensor_model_parallel_size"}
    assert "(did you mean recompute_method, recompute_granularity?)" in found["parallelism.megatron.recompute_methd"]
    assert "set from parallelism.tp" in found["parallelism.megatron.tensor_model_parallel_size"]
    assert MEGATRON_OWNED["tensor_model_parallel_size"] == "parallelism.tp"


def test_megatron_keys_against_the_installed_megatron_core():
    pytest.importorskip("megatron.core")
    assert megatron_config_fields()["recompute_granularity"] == "TransformerConfig"
    found = problems_for(["parallelism=megatron", "+parallelism.megatron.moe_router_topk_scalin=1.0"])
    assert "did you mean moe_router_topk_scaling_factor" in found["parallelism.megatron.moe_router_topk_scalin"]
    validate(typed_config(["parallelism=megatron", "+parallelism.megatron.moe_router_topk_scaling_factor=1.0"]))


def test_megatron_keys_without_megatron_core(monkeypatch):
    real = importlib.import_module

    def no_megatron(name, *args):
        if name.startswith("megatron"):
            raise ImportError(name)
        return real(name, *args)

    monkeypatch.setattr(config_check.importlib, "import_module", no_megatron)
    assert megatron_config_fields() is None
    found = problems_for(["+parallelism.megatron.recompute_granularity=full"])
    assert "do nothing with the fsdp backend" in found["parallelism.megatron"]
    found = problems_for(["parallelism=megatron", "+parallelism.megatron.recompute_granularity=full"])
    assert "megatron-core is not importable" in found["parallelism.megatron"]


def test_backend_option_rules():
    found = problems_for(
        ["parallelism=megatron", "parallelism.sequence_parallel=true", "parallelism.tp=2", "parallelism.pp=2"]
        + ["parallelism.vpp=2", "cluster.actor.num_gpus_per_node=4"]
    )
    assert "parallelism.sequence_parallel" not in found  # on CPU too (tests/train/megatron/test_parallel.py)
    assert "pair up wrongly on CPU" in found["parallelism.vpp"]
    found = problems_for(["parallelism=megatron", "parallelism.sequence_parallel=true"])
    assert "splits over tp ranks, and tp=1" in found["parallelism.sequence_parallel"]
    found = problems_for(["parallelism=megatron", "parallelism.recompute.method=uniform"])
    assert "granularity=full only" in found["parallelism.recompute"]
    found = problems_for(["parallelism.recompute.granularity=full", "parallelism.compile_layers=true"])  # fsdp
    assert "the fsdp backend would ignore it" in found["parallelism.recompute.granularity"]
    assert "the fsdp backend would ignore it" in found["parallelism.compile_layers"]
    selective = ["parallelism=megatron", "parallelism.recompute.granularity=selective"]
    found = problems_for([*selective, "parallelism.recompute.modules=[core_attn,layernorm]"])
    assert "['layernorm'] cannot be recomputed" in found["parallelism.recompute.modules"]
    validate(typed_config([*selective, "parallelism.recompute.modules=[core_attn,mlp]"]))  # no problem
    found = problems_for(
        ["model=tiny_qwen3_moe", "parallelism=megatron", "parallelism.tp=2", "cluster.actor.num_gpus_per_node=2"]
    )
    assert "only together with sequence parallelism" in found["parallelism.tp"]
