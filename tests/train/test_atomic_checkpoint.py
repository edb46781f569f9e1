"""Atomic checkpoints: a save killed part-way leaves the previous checkpoint the one every load picks.

These tests drive the fsdp backend's save directly (no Ray) and kill it at a chosen file; a whole run killed
(SIGKILL to every process) in its save phase and resumed is tests/e2e/test_killed_save_resume.py.
"""

from __future__ import annotations

import pytest
import torch

import slime.train.fsdp.checkpoint as fsdp_checkpoint
from slime.config import fill_derived
from slime.config.resume import tracked_iteration
from slime.plan.validate import validate
from slime.train.fsdp.checkpoint import TRACKER, iter_dir
from tests.helpers.compose import typed_config
from tests.helpers.fsdp_rank import batches_for, make_backend, make_samples, make_setup, train_rollout


class Killed(BaseException):
    """Stands for the process dying at that point of the save."""


def params(backend) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backend.model.named_parameters()}


@pytest.mark.parametrize("dies_at", ["optimizer.pt", "rng_rank0.pt", "publish", "tracker"])
def test_save_killed_at_any_file_leaves_the_previous_checkpoint(dies_at, tiny_model_dir, tmp_path, monkeypatch):
    root = tmp_path / "ckpt"
    backend = make_backend(make_setup(tiny_model_dir, ["train.lr=1e-2"]))
    batch = batches_for(make_samples(8, seed=0), dp=1, k=1)[0]
    train_rollout(backend, batch, rollout_id=0)
    backend.save_checkpoint(0, str(root))
    saved = params(backend)
    train_rollout(backend, batch, rollout_id=1)
    assert any(not torch.equal(saved[n], p) for n, p in params(backend).items())

    real_save = torch.save

    def dying_save(obj, path, *args, **kwargs):
        if str(path).endswith(dies_at):
            raise Killed
        return real_save(obj, path, *args, **kwargs)

    def dying_publish(staging, final):
        raise Killed

    def dying_replace(path, text):  # the temporary file written, the rename never happens
        path.with_name(path.name + ".tmp").write_text(text[:0])
        raise Killed

    monkeypatch.setattr(torch, "save", dying_save)
    if dies_at == "publish":
        monkeypatch.setattr(fsdp_checkpoint, "_publish", dying_publish)
    if dies_at == "tracker":
        monkeypatch.setattr(fsdp_checkpoint, "replace_text", dying_replace)
    with pytest.raises(Killed):
        backend.save_checkpoint(1, str(root))
    monkeypatch.undo()
    assert (root / TRACKER).read_text() == "0" and tracked_iteration(str(root)) == 0
    assert dies_at == "tracker" or not iter_dir(root, 1).exists()

    # checkpoint.resume=auto picks rollout 0 and a fresh backend continues from its exact weights
    cfg = typed_config([f"model.hf_checkpoint={tiny_model_dir}", "checkpoint.ref_load=null", "checkpoint.resume=auto"])
    cfg.checkpoint.save = str(root)
    cfg = fill_derived(cfg, validate(cfg))
    assert (cfg.checkpoint.load, cfg.checkpoint.ckpt_step) == (str(root), 0)
    resumed = make_backend(make_setup(tiny_model_dir, [f"checkpoint.load={root}", "checkpoint.ckpt_step=0"]))
    assert all(torch.equal(saved[n], p) for n, p in params(resumed).items())
    assert resumed.global_step == 1

    # the next save of rollout 1 clears the debris and becomes the latest
    resumed.save_checkpoint(1, str(root))
    assert (root / TRACKER).read_text() == "1"
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000000", "iter_0000001", TRACKER]
    assert (iter_dir(root, 1) / "optimizer.pt").exists() and (iter_dir(root, 1) / "model" / "config.json").exists()
    resumed.shutdown()
    backend.shutdown()


def test_resume_auto_without_a_checkpoint_starts_afresh(tiny_model_dir, tmp_path):
    cfg = typed_config([f"model.hf_checkpoint={tiny_model_dir}", "checkpoint.resume=auto"], str(tmp_path / "run"))
    cfg = fill_derived(cfg, validate(cfg))
    assert cfg.checkpoint.load is None and cfg.checkpoint.save == str(tmp_path / "run" / "checkpoints")
