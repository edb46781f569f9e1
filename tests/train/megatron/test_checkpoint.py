"""torch_dist checkpoints of the megatron backend: save then load continues training identically; a load
root without a tracker falls back to ref_load; the tracker and iteration directories are laid out
as slime's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from slime.net import free_port  # noqa: E402
from slime.train.megatron import checkpoint  # noqa: E402
from tests.helpers.fsdp_rank import batches_for, make_samples, make_setup, train_rollout  # noqa: E402


def _run(setup, batches: list, *, save_at: int | None = None) -> dict:
    """One rank: init (which loads checkpoint.load), then one rollout step per batch, saving after `save_at`;
    parameters after init and at the end."""
    from slime.train.layout import RankLayout
    from slime.train.megatron import parallel
    from slime.train.megatron.backend import MegatronBackend

    backend = MegatronBackend(setup, rank=0, layout=RankLayout(dp=1), master_addr="127.0.0.1", master_port=free_port())
    start = backend.init()
    params = {n: p.detach().clone() for n, p in backend.model[0].module.named_parameters()}
    steps = []
    for rollout_id, batch in enumerate(batches, start=start):
        steps.append(train_rollout(backend, batch, rollout_id=rollout_id)["steps"])
        if rollout_id == save_at:
            backend.save_checkpoint(rollout_id, setup.checkpoint.save)
    final = {n: p.detach().clone() for n, p in backend.model[0].module.named_parameters()}
    parallel.destroy()
    return {"start": start, "initial": params, "steps": steps, "final": final}


def _three_runs(model_dir: str, root: str) -> dict:
    base = ["parallelism=megatron", "parallelism.max_tokens_per_gpu=24", "train.lr=1e-2"]
    first, second = (batches_for(make_samples(8, seed=s), dp=1, k=1)[0] for s in (3, 4))
    straight = _run(make_setup(model_dir, [*base, f"checkpoint.save={root}"]), [first, second], save_at=0)
    resumed = _run(make_setup(model_dir, [*base, f"checkpoint.load={root}"]), [second])
    fallback = _run(
        make_setup(model_dir, [*base, f"checkpoint.load={root}/iter_0000000", f"checkpoint.ref_load={root}"]),
        [],
    )
    return {"straight": straight, "resumed": resumed, "fallback": fallback}


def test_save_then_load_continues_training_identically(tiny_model_dir, tmp_path):
    root = tmp_path / "ckpt"
    r = _three_runs(tiny_model_dir, str(root))  # in this process, one rank after another (world size 1)
    assert (root / checkpoint.TRACKER).read_text() == "0" and any((root / "iter_0000000").glob("*.distcp"))
    assert r["resumed"]["start"] == 1 and r["fallback"]["start"] == 0
    assert r["resumed"]["steps"][0] == r["straight"]["steps"][1]  # same loss, grad norm, lr: bit for bit
    for name, value in r["straight"]["final"].items():
        assert torch.equal(r["resumed"]["final"][name], value), name
    # load without a tracker: ref_load's weights (here the torch_dist root, so the weights after rollout 0)
    for name, value in r["resumed"]["initial"].items():
        assert torch.equal(r["fallback"]["initial"][name], value), name
    assert not torch.equal(r["straight"]["initial"][name], value)
