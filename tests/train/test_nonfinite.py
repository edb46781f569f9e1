"""A NaN or inf in a step's loss or gradients: `train.on_nonfinite=stop` (the default) raises naming the step and the
first non-finite tensor with nothing updated; `skip` drops the step's update and counts it; a model holding a
non-finite parameter is never saved nor pushed. On the fsdp backend's rank, driven directly."""

from __future__ import annotations

import math

import pytest
import torch
from ray.exceptions import RayTaskError

from slime.rollout.manager.deaths import failure_text
from slime.train.finite import NonFiniteError
from slime.train.fsdp.checkpoint import iter_dir
from tests.helpers.fsdp_rank import batches_for, make_backend, make_samples, make_setup, train_rollout
from tests.helpers.validation import config_problems

POISONED = "model.norm.weight"  # the final norm's gain: every token's loss depends on it


def params(backend) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backend.model.named_parameters()}


def poison_next_gradient(backend) -> None:
    """The next backward gives POISONED a NaN gradient (the loss stays finite), once."""
    param = dict(backend.model.named_parameters())[POISONED]
    handle = None

    def to_nan(grad):
        handle.remove()
        return grad * float("nan")

    handle = param.register_hook(to_nan)


@pytest.fixture
def batch():
    return batches_for(make_samples(8, seed=0), dp=1, k=1)[0]


def test_a_nonfinite_gradient_stops_naming_the_step_and_the_tensor_with_nothing_updated(tiny_model_dir, batch):
    backend = make_backend(make_setup(tiny_model_dir, ["train.lr=1e-2"]))
    train_rollout(backend, batch, rollout_id=0)
    before = params(backend)
    poison_next_gradient(backend)
    with pytest.raises(NonFiniteError) as info:
        train_rollout(backend, batch, rollout_id=1)
    message = str(info.value)
    assert message.startswith("train step 1: the gradient norm is nan")
    assert f"the first non-finite tensor on rank 0 is the gradient of {POISONED}" in message
    assert all(torch.equal(before[n], p) for n, p in params(backend).items())
    backend.shutdown()


def test_a_nonfinite_loss_is_named_as_the_loss(tiny_model_dir, batch):
    backend = make_backend(make_setup(tiny_model_dir))
    with torch.no_grad():
        dict(backend.model.named_parameters())[POISONED][0] = float("inf")
    with pytest.raises(
        NonFiniteError, match=r"step 0: the gradient norm is nan; the first non-finite tensor on rank 0 is the loss"
    ):
        train_rollout(backend, batch, rollout_id=0)
    backend.shutdown()


def test_skip_drops_the_steps_update_counts_it_and_trains_on(tiny_model_dir, batch):
    backend = make_backend(make_setup(tiny_model_dir, ["train.lr=1e-2", "train.on_nonfinite=skip"]))
    before = params(backend)
    poison_next_gradient(backend)
    (skipped,) = train_rollout(backend, batch, rollout_id=0)["steps"]
    assert skipped["train/nonfinite_skipped"] == 1.0 and math.isnan(skipped["train/grad_norm"])
    assert all(torch.equal(before[n], p) for n, p in params(backend).items())
    assert backend.global_step == 1 and not backend.optimizer.state  # no Adam moment took the NaN
    (trained,) = train_rollout(backend, batch, rollout_id=1)["steps"]
    assert trained["train/nonfinite_skipped"] == 0.0 and math.isfinite(trained["train/grad_norm"])
    after = params(backend)
    assert any(not torch.equal(before[n], after[n]) for n in after)
    assert all(bool(torch.isfinite(p).all()) for p in after.values())
    backend.shutdown()


def test_a_nonfinite_model_is_never_saved_nor_pushed(tiny_model_dir, tmp_path):
    backend = make_backend(make_setup(tiny_model_dir))
    with torch.no_grad():
        dict(backend.model.named_parameters())[POISONED][3] = float("nan")
    with pytest.raises(NonFiniteError, match=f"the checkpoint save of rollout 2 refused: parameter {POISONED} holds"):
        backend.save_checkpoint(2, str(tmp_path / "ckpt"))
    assert not iter_dir(tmp_path / "ckpt", 2).exists() and not (tmp_path / "ckpt").exists()
    with pytest.raises(NonFiniteError, match="a weight push refused"):
        next(iter(backend.export_weights(1 << 20)))
    backend.shutdown()


def test_the_key_takes_stop_or_skip_and_megatron_only_stops():
    assert "train.on_nonfinite" in config_problems(["train.on_nonfinite=ignore"])
    found = config_problems(["parallelism=megatron", "train.on_nonfinite=skip"])
    assert "megatron-core's optimizer applies a step" in found["train.on_nonfinite"]


def test_the_fault_hook_poisons_a_train_phase_only():
    found = config_problems(["debug.nonfinite_at=save:1"])
    assert "poisons a training step's gradient" in found["debug.nonfinite_at"]
    assert "debug.nonfinite_at" not in config_problems(["debug.nonfinite_at=train:1", "train.on_nonfinite=ignore"])


def test_result_json_names_a_workers_exception_as_itself():
    wrapped = RayTaskError("call", "remote traceback", NonFiniteError("train step 2: nan")).as_instanceof_cause()
    assert failure_text(wrapped) == "NonFiniteError: train step 2: nan"
    assert failure_text(ValueError("local")) == "ValueError: local"
