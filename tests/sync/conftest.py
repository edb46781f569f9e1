"""Sync-test fixtures: a trained fsdp rank whose weights the syncs carry, and a built-in engine (one per test
module) on the tiny checkpoint that they push into."""

from __future__ import annotations

import pytest

from tests.helpers.engines import start_engine
from tests.helpers.fsdp_rank import batches_for, make_backend, make_samples, make_setup, train_rollout


@pytest.fixture(scope="module")
def trained(tiny_model_dir):
    """An fsdp actor rank whose weights moved away from the checkpoint (one high-lr rollout step)."""
    backend = make_backend(make_setup(tiny_model_dir, ["train.lr=0.05"]))
    train_rollout(backend, batches_for(make_samples(8, seed=5), dp=1, k=2)[0])
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    """A built-in engine serving the tiny checkpoint, shut down after the module."""
    engine = start_engine(tiny_model_dir, tmp_path_factory.mktemp("engine_logs"))
    yield engine
    engine.shutdown()
