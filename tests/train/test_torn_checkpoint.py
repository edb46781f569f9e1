"""A checkpoint is whole or not used: each published iteration carries a manifest of its files' sizes and
checksums, verified before a run resumes. `checkpoint.resume=auto` falls back from a torn newest iteration to the
newest whole one and says so; an explicit `ckpt_step` that is torn is exit 2 naming the file; an empty or
unreadable tracker is never read as "no checkpoint"."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from slime.config import ConfigError, fill_derived
from slime.config.manifest import MANIFEST, sha256_of, torn_file
from slime.plan.validate import validate
from slime.train.fsdp.checkpoint import TRACKER, iter_dir
from tests.helpers.compose import typed_config
from tests.helpers.fsdp_rank import batches_for, make_backend, make_samples, make_setup, train_rollout


@pytest.fixture(scope="module")
def saved_twice(tiny_model_dir, tmp_path_factory):
    """A checkpoint root with iterations 0 and 1 of the fsdp backend (the tracker names 1), copied per test."""
    root = tmp_path_factory.mktemp("saved") / "ckpt"
    backend = make_backend(make_setup(tiny_model_dir, ["train.lr=1e-2"]))
    batch = batches_for(make_samples(8, seed=0), dp=1, k=1)[0]
    for rollout_id in (0, 1):
        train_rollout(backend, batch, rollout_id=rollout_id)
        backend.save_checkpoint(rollout_id, str(root))
    backend.shutdown()
    return root


@pytest.fixture
def root(saved_twice, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(saved_twice, copy)
    return copy


def resumed(tiny_model_dir, root, *overrides: str):
    """(checkpoint.load, checkpoint.ckpt_step) of a run resolving `overrides` against `root`."""
    cfg = typed_config([f"model.hf_checkpoint={tiny_model_dir}", "checkpoint.ref_load=null", *overrides])
    cfg.checkpoint.save = str(root)
    cfg = fill_derived(cfg, validate(cfg))
    return cfg.checkpoint.load, cfg.checkpoint.ckpt_step


def test_each_published_iteration_lists_every_file_with_its_size_and_checksum(root):
    for step in (0, 1):
        directory = iter_dir(root, step)
        files = json.loads((directory / MANIFEST).read_text())["files"]
        on_disk = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST}
        assert set(files) == on_disk and {"optimizer.pt", "model/model.safetensors", "rng_rank0.pt"} <= on_disk
        for name, entry in files.items():
            assert entry == {"bytes": (directory / name).stat().st_size, "sha256": sha256_of(directory / name)}
        assert torn_file(directory) is None


@pytest.mark.parametrize("damage", ["truncated", "missing", "altered"])
def test_resume_auto_falls_back_from_a_torn_newest_iteration_and_says_so(damage, root, tiny_model_dir, caplog):
    weights = iter_dir(root, 1) / "model" / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "missing":
        weights.unlink()
    else:  # same size, one byte changed
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="slime.config.resume"):
        assert resumed(tiny_model_dir, root, "checkpoint.resume=auto") == (str(root), 0)
    assert f"iteration 1 is torn: {weights}" in caplog.text and "resuming from iteration 0" in caplog.text
    assert resumed(tiny_model_dir, root, f"checkpoint.load={root}") == (str(root), 0)  # a load without ckpt_step too
    with pytest.raises(ConfigError) as info:
        resumed(tiny_model_dir, root, f"checkpoint.load={root}", "checkpoint.ckpt_step=1")
    assert [p.key for p in info.value.problems] == ["checkpoint.ckpt_step"]
    assert f"iteration 1 under {root} is torn: {weights}" in str(info.value)
    assert resumed(tiny_model_dir, root, f"checkpoint.load={root}", "checkpoint.ckpt_step=0") == (str(root), 0)


@pytest.mark.parametrize("content", ["", "  \n", "3x"])
def test_an_empty_or_garbled_tracker_is_never_no_checkpoint(content, root, tiny_model_dir, caplog):
    (root / TRACKER).write_text(content)
    with caplog.at_level(logging.WARNING, logger="slime.config.resume"):
        assert resumed(tiny_model_dir, root, "checkpoint.resume=auto") == (str(root), 1)
    assert str(root / TRACKER) in caplog.text and "resuming from iteration 1" in caplog.text


def test_no_whole_iteration_left_is_exit_2_not_a_fresh_start(root, tiny_model_dir):
    for step in (0, 1):
        (iter_dir(root, step) / "optimizer.pt").unlink()
    with pytest.raises(ConfigError) as info:
        resumed(tiny_model_dir, root, "checkpoint.resume=auto")
    assert [p.key for p in info.value.problems] == ["checkpoint.save"]
    assert f"no whole checkpoint under it ({iter_dir(root, 1) / 'optimizer.pt'} is missing)" in str(info.value)
    for step in (0, 1):  # an empty tracker beside no iteration at all
        shutil.rmtree(iter_dir(root, step))
    (root / TRACKER).write_text("")
    with pytest.raises(ConfigError, match=f"checkpoint.save='{root}': {root / TRACKER} is empty"):
        resumed(tiny_model_dir, root, "checkpoint.resume=auto")


def test_an_iteration_missing_its_data_source_state_is_torn(root, tiny_model_dir):
    (root / "rollout").mkdir()
    (root / "rollout" / "global_dataset_state_dict_0.pt").write_bytes(b"state")
    assert resumed(tiny_model_dir, root, "checkpoint.resume=auto") == (str(root), 0)
