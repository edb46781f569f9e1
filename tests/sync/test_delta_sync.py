"""Delta pushes (`rollout.weight_sync.delta`) from a trained fsdp rank into a real hf engine process, verified: after a
full push, a push carries only the changed bits of the changed tensors and the engine's weights are bit-identical to
the trainer's (the verification compares whole tensors); every `full_every`-th push, and the one after a failed push,
is full."""

from __future__ import annotations

import pytest
import torch

from slime.sync.base import SyncContext, WeightMismatchError
from slime.wire.weight_delta import DELTA_GAPS
from tests.helpers.planted_faults import planted
from tests.helpers.weights import engine_checksums, trainer_checksums


def nudge(model, rows: int) -> None:
    """Change `rows` rows' first three values of one projection and the final norm's first gain, as a small step."""
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[:rows, :3] += 1e-3
        model.model.norm.weight[0] += 1e-3


@pytest.mark.parametrize("mode", ["tensor", "distributed"])
def test_delta_pushes_carry_the_changed_bits_and_leave_the_engine_bit_identical(
    trained, engine, tiny_model_dir, tmp_path, monkeypatch, mode
):
    context = SyncContext(
        source_checkpoint=tiny_model_dir, engine="hf", work_dir=str(tmp_path), bucket_bytes=20_000, verify=True,
        delta_full_every=3,
    )  # fmt: skip
    full_bytes = sum(p.numel() * 4 for p in trained.model.parameters())
    trained.connect_weight_sync(mode, [engine.url], context)
    try:
        first = trained.update_weights(weight_version=1)  # full: nothing pushed before
        assert first["perf/update_weights_bytes"] == full_bytes and first["perf/update_weights_changed_fraction"] == 1
        nudge(trained.model, rows=4)
        delta = trained.update_weights(weight_version=2)
        # 13 elements changed: each carried as a 2-byte gap and its 4 bits (fp32)
        assert delta["perf/update_weights_bytes"] == 13 * (2 + 4)
        assert delta["perf/update_weights_changed_fraction"] == pytest.approx(13 / (full_bytes / 4))
        assert engine_checksums(engine.url) == trainer_checksums(trained.model)  # bit for bit
        nudge(trained.model, rows=1)
        assert trained.update_weights(weight_version=3)["perf/update_weights_bytes"] == 4 * 6
        assert trained.update_weights(weight_version=4)["perf/update_weights_bytes"] == full_bytes  # the 3rd: full
        nudge(trained.model, rows=2)
        with planted(monkeypatch, flip="model.layers.0.mlp.up_proj.weight"):  # a delta taken of corrupted bits
            with pytest.raises(
                WeightMismatchError, match=r"version 5: model\.layers\.0\.mlp\.up_proj\.weight \(bucket"
            ):
                trained.update_weights(weight_version=5)
        assert trained.update_weights(weight_version=6)["perf/update_weights_bytes"] == full_bytes  # after a failure
        assert engine_checksums(engine.url) == trainer_checksums(trained.model)
    finally:
        trained.close_weight_sync()


def test_an_engine_refuses_a_delta_of_another_width_or_for_a_tensor_it_lacks(engine):
    from slime.engine.http_client import EngineHTTPError
    from slime.sync.tensor import packed
    from slime.wire import bucket_codec

    gaps = torch.tensor([1], dtype=torch.int16).view(torch.uint8)
    for name, values, says in (
        (
            "model.norm.weight",
            torch.tensor([7], dtype=torch.int16),
            "2 bytes of values for 1 positions; the engine holds",
        ),
        ("model.nowhere.weight", torch.tensor([7], dtype=torch.int32), "a delta for unexpected tensor model.nowhere"),
    ):
        bucket = [(name + DELTA_GAPS, gaps), (name + "@delta.values", values.view(torch.uint8))]
        engine.client.begin_weight_update()
        try:
            with packed(bucket) as (flat, metadata), pytest.raises(EngineHTTPError, match=says):
                engine.client.update_weights_from_tensor([bucket_codec.encode(flat, metadata)])
        finally:
            engine.client.finish_weight_update(None)
