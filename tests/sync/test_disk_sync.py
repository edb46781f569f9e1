"""Disk weight sync and HF export through the train backend's bucket iterator, into a real hf engine."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from slime.sync.base import SyncContext
from tests.helpers.engines import start_engine


def test_export_is_every_parameter_once_in_buckets(trained):
    buckets = list(trained.export_weights(bucket_bytes=20_000))
    assert len(buckets) > 1 and all(sum(t.numel() * t.element_size() for _, t in b[:-1]) < 20_000 for b in buckets)
    exported = {name: t for bucket in buckets for name, t in bucket}
    params = dict(trained.model.named_parameters())  # tied lm_head appears once, as embed_tokens
    assert exported.keys() == params.keys() and "lm_head.weight" not in exported
    assert all(torch.equal(exported[n], p.detach()) for n, p in params.items())


def test_save_hf_round_trips_bit_exact(trained, tmp_path):
    from transformers import AutoModelForCausalLM

    trained.save_hf(str(tmp_path / "hf"))
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(dict(trained.model.named_parameters()))
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    for name, param in trained.model.named_parameters():
        assert torch.equal(reloaded.get_parameter(name), param.detach()), name


@pytest.mark.parametrize("keep", [False, True])
def test_disk_sync_directories_are_removed_unless_kept(trained, tiny_model_dir, tmp_path, keep):
    """What disk mode leaves behind (tests/sync/test_sync_modes.py checks the weights bit for bit)."""
    engine = start_engine(tiny_model_dir, tmp_path / "logs")
    url = engine.url
    try:
        context = SyncContext(source_checkpoint=tiny_model_dir, work_dir=str(tmp_path), bucket_bytes=20_000, keep=keep)
        trained.connect_weight_sync("disk", [url], context)
        trained.update_weights(weight_version=3)
        assert engine.client.get_weight_version() == "3"
        pushed = tmp_path / "weights" / "weight_v000003"
        assert pushed.exists() == keep
        if keep:
            shards = {k for f in pushed.glob("*.safetensors") for k in load_file(str(f))}
            assert shards == set(dict(trained.model.named_parameters())) and (pushed / "config.json").exists()
    finally:
        trained.close_weight_sync()
        engine.shutdown()
    assert (tmp_path / "weights").exists() == keep  # close() removes what is not kept
