"""The megatron optimizer's fp32 master weights start from an fp32 checkpoint's own values, not from the bf16
parameters made of them (rounded masters would keep SmolLM2's first ~10 updates at lr 5e-6 from moving
any bf16 weight); one CPU rank in bf16."""

from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("megatron.core")

from slime.train.megatron import hf_weights  # noqa: E402
from tests.helpers import megatron_standalone as standalone  # noqa: E402
from tests.helpers.compose import typed_config  # noqa: E402


def model_config(model_dir):
    import dataclasses

    return dataclasses.replace(typed_config([]).model, hf_checkpoint=str(model_dir))


def checkpoint_values(backend, model_dir) -> dict:
    cfg = backend.setup.model
    return {p.param: local for p, local in hf_weights.checkpoint_shards(backend.model, model_dir, cfg, head="lm")}


def test_master_weights_hold_the_fp32_checkpoint_and_train_from_it(tiny_model_dir):
    backend = standalone.build(model_config(tiny_model_dir), device="cpu", precision="bf16", lr=1e-3)
    try:
        shards = hf_weights.main_param_shards(backend.optimizer)
        values = checkpoint_values(backend, tiny_model_dir)
        assert len(shards) == len(values) > 0
        off_grid = 0
        for param, (main, start, end) in shards.items():
            exact = values[param].reshape(-1)[start:end]
            assert exact.dtype == torch.float32 and param.dtype == torch.bfloat16
            assert torch.equal(main, exact)  # the checkpoint's values, not the bf16 parameter's
            assert torch.equal(param.reshape(-1)[start:end], exact.to(torch.bfloat16))
            off_grid += int((exact.to(torch.bfloat16).float() != exact).sum())
        assert off_grid > 1000  # random fp32 weights: nearly all lie between bf16 values
        samples = [([5, 6, 7, 8, 9, 10], [1, 1, 1]), ([11, 12, 13, 14], [1, 1])]
        standalone.train_step(backend, samples)
        moved = [(main - values[p].reshape(-1)[s:e]).abs().max().item() for p, (main, s, e) in shards.items()]
        assert 0 < max(moved) <= 1e-3 * 1.01  # one Adam step of lr 1e-3 away from the checkpoint's values
    finally:
        backend.shutdown()


def test_a_bf16_checkpoint_is_not_read_twice(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    bf16_dir = tmp_path / "bf16"
    shutil.copytree(tiny_model_dir, bf16_dir)
    for file in bf16_dir.glob("*.safetensors"):
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(file).items()}, file, metadata={"format": "pt"})
    backend = standalone.build(model_config(bf16_dir), device="cpu", precision="bf16")
    try:
        assert hf_weights.load_hf_main_params(backend.optimizer, backend.model, bf16_dir, backend.setup.model) == 0
        values = checkpoint_values(backend, bf16_dir)
        for param, (main, start, end) in hf_weights.main_param_shards(backend.optimizer).items():
            assert torch.equal(main, values[param].reshape(-1)[start:end].float())
    finally:
        backend.shutdown()
