"""Each weight-sync mode from a trained fsdp rank into the fake SGLang server, whose weight routes are SGLang
0.5.23's own deserialiser, weight updater and process-group calls (tests/fakes/fake_sglang.py): bit-exact
weights (its /weights_checker checksums against the trainer's), the version on /model_info, and the session
rule SGLang's scheduler enforces."""

from __future__ import annotations

import os

import pytest

from slime.engine.http_client import EngineHTTPError
from slime.sync.base import SyncContext
from slime.wire import bucket_codec
from tests.helpers.fake_sglang_engine import make_engine, requests_logged
from tests.helpers.weights import engine_checksums, trainer_checksums


@pytest.fixture(scope="module")
def fakes(tiny_model_dir, tmp_path_factory):
    """A one-rank fake (distributed needs one process per rank) and a tp-2 fake (two items per tensor bucket)."""
    logs = tmp_path_factory.mktemp("fake_sglang_logs")
    one, two = make_engine(tiny_model_dir, logs / "tp1"), make_engine(tiny_model_dir, logs / "tp2", gpu_ids=("0", "1"))
    for engine in (one, two):
        engine.launch()
    try:
        for engine in (one, two):
            engine.wait_until_ready()
        yield {1: one, 2: two}
    finally:
        one.shutdown()
        two.shutdown()


@pytest.mark.parametrize("mode,tp", [("disk", 2), ("tensor", 2), ("distributed", 1)])
def test_each_mode_makes_the_fake_sglang_bit_exact(trained, fakes, tiny_model_dir, tmp_path, mode, tp):  # noqa: F811
    engine = fakes[tp]
    engine.client.update_weights_from_disk(tiny_model_dir, weight_version="0")  # back to the checkpoint
    assert engine_checksums(engine.url) != trainer_checksums(trained.model)
    context = SyncContext(source_checkpoint=tiny_model_dir, work_dir=str(tmp_path), bucket_bytes=20_000)
    trained.connect_weight_sync(mode, [engine.url], context)
    before = len(requests_logged(engine))
    try:
        trained.update_weights(weight_version=3)
    finally:
        trained.close_weight_sync()
    assert engine_checksums(engine.url) == trainer_checksums(trained.model)
    assert engine.client.get_weight_version() == "3"
    paths = [r["path"] for r in requests_logged(engine)[before:]]
    if mode != "disk":  # the buckets ran inside one session
        updates = [i for i, p in enumerate(paths) if p.startswith("/update_weights_from_")]
        assert paths.index("/begin_weight_update") < updates[0] and updates[-1] < paths.index("/end_weight_update")
    if mode == "tensor":
        items = [
            r["body"]["serialized_named_tensors"] for r in requests_logged(engine)[before:] if "tensor" in r["path"]
        ]
        # one item per TP rank, both this trainer's bucket (the fake logs the shared segment each names)
        assert items and all(len(pair) == 2 and pair[0] == pair[1] for pair in items)
        assert all(pair[0].startswith(f"/torch_{os.getpid()}_") for pair in items)


def test_an_update_outside_a_session_is_refused_as_sglang_refuses_it(fakes):
    engine = fakes[1]
    flat, metadata = bucket_codec.empty_bucket()
    with pytest.raises(EngineHTTPError, match="must run between begin_weight_update\\(\\) and end_weight_update\\(\\)"):
        engine.client.update_weights_from_tensor([bucket_codec.encode(flat, metadata)], weight_version="9")
    engine.client.begin_weight_update()
    with pytest.raises(EngineHTTPError, match="already open"):
        engine.client.begin_weight_update()
    engine.client.update_weights_from_tensor([bucket_codec.encode(flat, metadata)], weight_version="9")
    engine.client.finish_weight_update("9")
    with pytest.raises(EngineHTTPError, match="no weight-update session is open"):
        engine.client.finish_weight_update("9")
    assert engine.client.get_weight_version() == "9"
