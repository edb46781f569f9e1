"""Tensor mode through reused staging buffers (slime.sync.staging) into a real hf engine process on CPU: the engine
holds every pushed tensor after pushes of differing bucket sizes, buckets larger than the buffers included; every
push names the same shared-memory segments; an engine error mid-push leaves only the two buffers; an engine
without `reuses_tensor_buffers` gets a fresh buffer per bucket."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from slime.engine.hf.weight_checker import tensor_checksum
from slime.engine.hf.weights import read_safetensors_dir
from slime.engine.http_client import EngineHTTPError
from slime.sync.base import SyncContext
from slime.sync.tensor import TensorWeightSync
from slime.wire import bucket_codec
from slime.wire.tensors import in_buckets
from tests.helpers.processes import own_shm_segments
from tests.helpers.weights import engine_checksums


def hf_context(model_dir, tmp_path, engine: str = "hf") -> SyncContext:
    return SyncContext(source_checkpoint=model_dir, engine=engine, work_dir=str(tmp_path), bucket_bytes=20_000)


def recording(sync: TensorWeightSync) -> list[tuple[list[str], dict]]:
    """Every update call's (shared-memory segment of each item, keyword arguments), recorded as it passes."""
    calls = []
    engine = sync.engines[0]
    send = engine.update_weights_from_tensor

    def record(handles, **kwargs):
        calls.append(([bucket_codec.shm_segment(bucket_codec.describe(h)[0])[0] for h in handles], kwargs))
        return send(handles, **kwargs)

    engine.update_weights_from_tensor = record
    return calls


def assert_engine_holds(url: str, named: list[tuple[str, torch.Tensor]]) -> None:
    got = engine_checksums(url)
    assert {n: got[n] for n, _ in named} == {n: tensor_checksum(t) for n, t in named}


def test_pushes_of_any_bucket_size_go_through_two_kept_buffers(trained, engine, tiny_model_dir, tmp_path):
    trainer = [(n, t.detach().clone()) for bucket in trained.export_weights(bucket_bytes=1 << 30) for n, t in bucket]
    checkpoint = [(n, t) for n, t in read_safetensors_dir(tiny_model_dir).items() if n != "lm_head.weight"]
    sync = TensorWeightSync([engine.client], hf_context(tiny_model_dir, tmp_path))
    calls = recording(sync)
    try:
        segments = []
        # 20 kB buckets, then 60 kB ones (the buffers grow), smaller ones, one bucket of everything, 20 kB again
        pushes = [(trainer, 20_000), (checkpoint, 60_000), (trainer, 8_000), (checkpoint, 1 << 30), (trainer, 20_000)]
        before = own_shm_segments()
        for version, (named, size) in enumerate(pushes):
            start = len(calls)
            buckets = list(in_buckets(named, size))
            assert sync.push(buckets, weight_version=version)["perf/update_weights_bytes"] > 0
            assert_engine_holds(engine.url, named)
            segments.append({s for handles, _ in calls[start:] for s in handles})
            assert len(calls) - start == len(buckets)
            # two buffers live, on both sides: a replaced one is let go by the engine once it opened a newer one
            assert len(own_shm_segments() - before) == 2 and segments[-1] & own_shm_segments() <= segments[-1]
            assert sync.staging.nbytes() >= max(sum(t.numel() * t.element_size() for _, t in b) for b in buckets)
        assert [kwargs for _, kwargs in calls] == [
            {"weight_version": str(v), "keep_mapping": True}
            for v, (named, size) in enumerate(pushes)
            for _ in in_buckets(named, size)
        ]
        assert len(segments[2]) == 2 and segments[2] <= segments[1]  # smaller buckets: the same two buffers
        assert segments[4] <= segments[3] | segments[2]
    finally:
        sync.close()
    assert sync.staging.nbytes() == 0 and len(own_shm_segments() - before) == 2  # until the engine lets them go


def test_an_engine_error_mid_push_leaves_the_two_buffers_only(trained, engine, tiny_model_dir, tmp_path):
    sync = TensorWeightSync([engine.client], hf_context(tiny_model_dir, tmp_path))
    try:
        good = list(trained.export_weights(bucket_bytes=20_000))
        sync.push(good, weight_version=1)
        kept = own_shm_segments()
        bad = [*good[0], ("model.no_such.weight", torch.zeros(3))]
        with pytest.raises(EngineHTTPError, match="unexpected tensors: model.no_such.weight"):
            sync.push([good[0], bad, good[1]], weight_version=2)
        assert own_shm_segments() == kept and not any(sync.staging.busy)
        sync.push(good, weight_version=3)
        assert own_shm_segments() == kept
        assert_engine_holds(engine.url, [t for bucket in good for t in bucket])
    finally:
        sync.close()


@pytest.mark.parametrize("engine_kind", ["sglang", "vllm"])
def test_an_engine_that_copies_after_replying_gets_a_fresh_buffer_per_bucket(engine_kind, tmp_path):
    sent = []
    engine = SimpleNamespace(url="http://e", server_info=lambda: {"tp_size": 1})

    def update(handles, **kwargs):
        sent.append((bucket_codec.shm_segment(bucket_codec.describe(handles[0])[0])[0], kwargs))
        bucket_codec.decode(handles[0])  # read, as an engine does: the item's reference is taken back

    engine.update_weights_from_tensor = update
    sync = TensorWeightSync([engine], hf_context("-", tmp_path, engine=engine_kind))
    assert sync.staging is None
    buckets = [[("w", torch.full((64,), float(i)))] for i in range(4)]
    sync._transfer(iter(buckets), weight_version="1")
    assert [kwargs for _, kwargs in sent] == [{"weight_version": "1"}] * 4
    assert len({path for path, _ in sent}) == 4  # none reused


def test_per_rank_handles_get_fresh_buffers(tmp_path):
    context = dataclasses.replace(hf_context("-", tmp_path), tp_trainer_ranks=((0, 1),))
    engine = SimpleNamespace(url="http://e", server_info=lambda: {"tp_size": 2})
    assert TensorWeightSync([engine], context).staging is None
