"""Validation of the megatron backend's config: parallelism.megatron against megatron-core's fields, and the
backend's own option rules; all before anything starts (exit 2 through ConfigError)."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from slime.config.problems import ConfigError
from slime.plan.validate import validate
from slime.train.layout import pipeline_stage_layers
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


def test_unequal_pipeline_stages():
    """DeepSeek-V3's 61 layers over pp 4: no equal split; 16, 16, 16, 13 or 10, 17, 17, 17 ..."""
    four = [
        "model=deepseek_v3",
        "parallelism=megatron",
        "cluster.ray_address=auto",
        "cluster.actor.num_gpus_per_node=4",
    ]
    found = problems_for([*four, "parallelism.pp=4"])
    assert "cannot share the remaining 61 equally" in found["parallelism.pp"]
    for split in ("parallelism.pp_last_stage_layers=13", "parallelism.pp_first_stage_layers=10"):
        # the run still lacks a checkpoint, prompts and a reward; nothing about its split
        assert not [key for key in problems_for([*four, "parallelism.pp=4", split]) if key.startswith("parallelism")]
    found = problems_for([*four, "parallelism.pp=4", "parallelism.pp_first_stage_layers=12"])
    assert "the other 3 stage(s) cannot share the remaining 49" in found["parallelism.pp_first_stage_layers"]
    found = problems_for(["parallelism=megatron", "parallelism.pp_last_stage_layers=2"])
    assert "for pp >= 2 without virtual stages" in found["parallelism.pp_last_stage_layers"]
    found = problems_for(["parallelism.pp_first_stage_layers=2"])  # fsdp
    assert "the fsdp backend would ignore it" in found["parallelism.pp_first_stage_layers"]
    assert pipeline_stage_layers(61, 4, last=13) == (16, 16, 16, 13)
    assert pipeline_stage_layers(61, 4, first=13, last=16) == (13, 16, 16, 16)
    assert pipeline_stage_layers(61, 1) == (61,)


def test_unequal_stages_are_what_megatron_builds():
    """megatron-core's own count of each stage's layers (`get_num_layers_to_build`) from the config we give it."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    from slime.train.megatron.model_config import transformer_config

    cfg = typed_config(["model=deepseek_v3", "parallelism=megatron", "parallelism.pp=4"])
    for first, last in ((None, 13), (13, None), (13, 16)):
        p = dataclasses.replace(cfg.parallelism, pp_first_stage_layers=first, pp_last_stage_layers=last)
        config = transformer_config(cfg.model, p, params_dtype=torch.float32, device="cpu")
        built = tuple(get_num_layers_to_build(config, pp_rank=stage) for stage in range(4))
        assert built == pipeline_stage_layers(61, 4, first=first, last=last), (first, last)
