"""disk, tensor and distributed weight syncs from a trained fsdp rank into a real hf engine process:
bit-exact weights (the engine's checksum endpoint), the new weight version, the trainer's log-probs;
the distributed group rebuilt for a restarted engine; engine errors named and generation continued."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from slime.engine import http_client
from slime.engine.hf.weights import read_safetensors_dir
from slime.engine.http_client import EngineHTTPError
from slime.sync.base import SyncContext, WeightMismatchError
from tests.helpers.engines import start_engine
from tests.helpers.fsdp_rank import response_log_probs
from tests.helpers.processes import own_shm_segments
from tests.helpers.weights import engine_checksums, trainer_checksums

PROMPT = {
    "input_ids": [1, 5, 11, 16],
    "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
    "return_logprob": True,
}


def context(model_dir, tmp_path, check=True) -> SyncContext:
    return SyncContext(
        source_checkpoint=model_dir, work_dir=str(tmp_path), bucket_bytes=20_000, check_weight_update_equal=check
    )


def assert_runs_trainer_weights(backend, url: str, version: str) -> None:
    assert http_client.get(url + "/model_info")["weight_version"] == version
    assert engine_checksums(url) == trainer_checksums(backend.model)  # bit-exact, every tensor
    after = http_client.post(url + "/generate", PROMPT)
    assert after["meta_info"]["weight_version"] == version
    trainer_lp = response_log_probs(backend, PROMPT["input_ids"], after["output_ids"])
    engine_lp = torch.tensor([lp for lp, *_ in after["meta_info"]["output_token_logprobs"]])
    assert (trainer_lp - engine_lp).abs().max() < 1e-5


@pytest.mark.parametrize("mode", ["disk", "tensor", "distributed"])
def test_sync_makes_the_engine_bit_exact(trained, engine, tiny_model_dir, tmp_path, mode):  # noqa: F811
    engine.client.update_weights_from_disk(tiny_model_dir, weight_version="0")  # back to the checkpoint
    assert engine_checksums(engine.url) != trainer_checksums(trained.model)
    shm_before = own_shm_segments()
    trained.connect_weight_sync(mode, [engine.url], context(tiny_model_dir, tmp_path))
    try:
        perf = trained.update_weights(weight_version=3)
        assert perf["perf/update_weights_bytes"] == sum(p.numel() * 4 for p in trained.model.parameters())
        if mode == "tensor":  # its phases: packing the next bucket overlaps the engine's loading of this one
            phases = perf["perf/update_weights_pack_time"], perf["perf/update_weights_load_time"]
            assert all(0 < t < perf["perf/update_weights_time"] for t in phases)
        assert_runs_trainer_weights(trained, engine.url, "3")
        assert own_shm_segments() <= shm_before  # every bucket's shared memory was freed
    finally:
        trained.close_weight_sync()


def test_the_first_push_is_compared_with_the_checkpoint_snapshot(trained, engine, tiny_model_dir, tmp_path):  # noqa: F811
    """slime's --check-weight-update-equal: snapshot the checkpoint, reset to random, push version 0, compare."""
    engine.client.update_weights_from_disk(tiny_model_dir, weight_version="0")
    trained.connect_weight_sync("tensor", [engine.url], context(tiny_model_dir, tmp_path))
    try:
        for action in ("snapshot", "reset_tensors"):
            engine.client.check_weights(action)
        with pytest.raises(WeightMismatchError, match=rf"{engine.url}.*compare.*tensors differ"):
            trained.update_weights(weight_version=0)  # the trained weights are not the checkpoint's
        assert len(http_client.post(engine.url + "/generate", PROMPT, timeout=30)["output_ids"]) == 6  # continued
        engine.client.update_weights_from_disk(tiny_model_dir, weight_version="0")
        for action in ("snapshot", "reset_tensors"):
            engine.client.check_weights(action)
        checkpoint = [[(n, t) for n, t in read_safetensors_dir(tiny_model_dir).items() if n != "lm_head.weight"]]
        trained.weight_sync.push(checkpoint, weight_version=0)  # the checkpoint itself: every tensor restored
        without_norm = [[(n, t) for n, t in checkpoint[0] if n != "model.norm.weight"]]
        for action in ("snapshot", "reset_tensors"):
            engine.client.check_weights(action)
        with pytest.raises(WeightMismatchError, match=r"model\.norm\.weight"):
            trained.weight_sync.push(without_norm, weight_version=0)  # one tensor not delivered
    finally:
        trained.close_weight_sync()


@pytest.mark.parametrize("mode", ["tensor", "distributed"])
def test_engine_error_names_the_engine_and_generation_continues(trained, engine, tiny_model_dir, tmp_path, mode):  # noqa: F811
    trained.connect_weight_sync(mode, [engine.url], context(tiny_model_dir, tmp_path, check=False))
    try:
        good = next(iter(trained.export_weights(bucket_bytes=20_000)))
        bad = [*good, ("model.no_such.weight", torch.zeros(3))]
        refused = rf"{engine.url}/update_weights_from_\w+.*unexpected tensors: model\.no_such\.weight"
        with pytest.raises(EngineHTTPError, match=refused):
            trained.weight_sync.push([bad], weight_version=99)
        assert engine.client.get_weight_version() != "99"  # nothing of the bad bucket was loaded
        out = http_client.post(engine.url + "/generate", PROMPT, timeout=30)  # not left paused
        assert len(out["output_ids"]) == 6
        if mode == "tensor":  # a failure while the next bucket is packed: it is freed all the same
            shm_before = own_shm_segments()
            with pytest.raises(EngineHTTPError, match=refused):
                trained.weight_sync.push([good, bad, good], weight_version=98)
            assert own_shm_segments() <= shm_before
        if mode == "distributed":  # the group stayed in step: the next push works
            trained.update_weights(weight_version=5)
            assert_runs_trainer_weights(trained, engine.url, "5")
    finally:
        trained.close_weight_sync()


def test_distributed_group_is_rebuilt_for_a_restarted_engine(trained, tiny_model_dir, tmp_path):  # noqa: F811
    first = start_engine(tiny_model_dir, tmp_path / "logs1")
    try:
        trained.connect_weight_sync("distributed", [first.url], context(tiny_model_dir, tmp_path))
        trained.update_weights(weight_version=6)
        old_group = trained.weight_sync.group_name
    finally:
        first.shutdown()
    second = start_engine(tiny_model_dir, tmp_path / "logs2")  # fresh process: knows no group
    try:
        second.client.begin_weight_update()
        with pytest.raises(EngineHTTPError, match=f"Group {old_group} not in"):
            second.client.update_weights_from_distributed(names=[], dtypes=[], shapes=[], group_name=old_group)
        second.client.finish_weight_update(None)
        trained.connect_weight_sync("distributed", [second.url], context(tiny_model_dir, tmp_path))
        assert trained.weight_sync.group_name != old_group
        trained.update_weights(weight_version=7)
        assert_runs_trainer_weights(trained, second.url, "7")
    finally:
        trained.close_weight_sync()
        second.shutdown()


def test_engine_failing_before_the_broadcast_raises_at_once(trained, engine, tiny_model_dir, tmp_path):  # noqa: F811
    import time

    trained.connect_weight_sync("distributed", [engine.url], context(tiny_model_dir, tmp_path, check=False))
    try:
        sync = trained.weight_sync
        engine.client.destroy_weights_update_group(sync.group_name)  # as if the engine lost the group
        start = time.monotonic()
        with pytest.raises(EngineHTTPError, match=rf"{engine.url}/update_weights_from_distributed.*Group \S+ not in"):
            trained.update_weights(weight_version=8)
        assert time.monotonic() - start < 30 and sync.group is None
        assert len(http_client.post(engine.url + "/generate", PROMPT, timeout=30)["output_ids"]) == 6
        trained.update_weights(weight_version=9)  # rebuilds the dropped group first
        assert_runs_trainer_weights(trained, engine.url, "9")
    finally:
        trained.close_weight_sync()


# One long-lived reader (an engine process): opens each item of stdin, reads it and lets it go, as an engine does.
READ_ITEMS = """
import gc, sys
from slime.wire import bucket_codec
for item in sys.stdin.read().split():
    try:
        flat, metadata = bucket_codec.decode(item)
        print(int(flat.sum()), flush=True)
        del flat
        gc.collect()
    except RuntimeError as exc:
        print(type(exc).__name__, flush=True)
"""


def test_every_reader_of_a_cpu_bucket_opens_an_item_of_its_own():
    """Tensor mode into engines that read the same bucket (here 3 TP ranks' items read by one process, as engines
    in turn read theirs): every read opens an item of its own (torch's file_system sharing counts readers per
    serialised item; once an item's readers released it, a further read of it finds the buffer gone)."""
    from slime.sync.tensor import TensorWeightSync

    opened = []

    def read_each(handles, weight_version):
        proc = subprocess.run(
            [sys.executable, "-c", READ_ITEMS], input=" ".join(handles), capture_output=True, text=True
        )
        opened.extend(proc.stdout.split() or [proc.stderr[-500:]])

    engine = SimpleNamespace(url="http://tp3", server_info=lambda: {"tp_size": 3})
    engine.update_weights_from_tensor = read_each
    sync = TensorWeightSync([engine], SyncContext(source_checkpoint="-", work_dir="-", bucket_bytes=1 << 20))
    bucket = [("w", torch.ones(256, dtype=torch.uint8)), ("b", torch.full((16,), 2, dtype=torch.uint8))]
    assert sync._transfer(iter([bucket]), weight_version="1") == 272
    assert opened == ["288"] * 3
