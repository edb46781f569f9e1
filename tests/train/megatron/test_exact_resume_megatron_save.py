"""The megatron backend's save is atomic like the fsdp one's: a re-save of the very iteration the tracker
names, killed after its shards were written and before they were published, leaves that checkpoint
intact (a fresh backend resumes from its exact weights); the next save of it replaces it cleanly."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core import dist_checkpointing  # noqa: E402

from slime.net import free_port  # noqa: E402
from slime.train.megatron import checkpoint  # noqa: E402
from tests.helpers.fsdp_rank import batches_for, make_samples, make_setup, train_rollout  # noqa: E402


class Killed(BaseException):
    """Stands for the process dying at that point of the save."""


def _backend(setup):
    from slime.train.layout import RankLayout
    from slime.train.megatron.backend import MegatronBackend

    backend = MegatronBackend(setup, rank=0, layout=RankLayout(dp=1), master_addr="127.0.0.1", master_port=free_port())
    return backend, backend.init()


def _params(backend) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backend.model[0].module.named_parameters()}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


def test_resave_of_the_tracked_iteration_killed_mid_way_keeps_it(tiny_model_dir, tmp_path, monkeypatch):
    from slime.train.megatron import parallel

    root = tmp_path / "ckpt"
    base = ["parallelism=megatron", "parallelism.max_tokens_per_gpu=24", "train.lr=1e-2"]
    batch = batches_for(make_samples(8, seed=3), dp=1, k=1)[0]
    backend, _ = _backend(make_setup(tiny_model_dir, [*base, f"checkpoint.save={root}"]))
    train_rollout(backend, batch, rollout_id=0)
    backend.save_checkpoint(0, str(root))
    saved = _params(backend)
    train_rollout(backend, batch, rollout_id=1)
    trained = _params(backend)
    assert not _equal(saved, trained)

    real_save = dist_checkpointing.save

    def dying_save(state, directory, *args, **kwargs):  # every shard written, then the process dies
        real_save(state, directory, *args, **kwargs)
        raise Killed

    monkeypatch.setattr(dist_checkpointing, "save", dying_save)
    with pytest.raises(Killed):
        backend.save_checkpoint(0, str(root))  # the tracker names 0: the old code emptied iter_0000000 first
    monkeypatch.undo()
    assert checkpoint.read_tracker(root) == 0 and (root / ".iter_0000000.partial").is_dir()
    parallel.destroy()

    resumed, start = _backend(make_setup(tiny_model_dir, [*base, f"checkpoint.load={root}"]))
    assert start == 1 and _equal(_params(resumed), saved)
    resumed.save_checkpoint(0, str(root))  # a complete re-save replaces it, debris cleared
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000000", checkpoint.TRACKER]
    parallel.destroy()
