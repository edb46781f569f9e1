"""The plan counts the staging buffers a tensor-mode sync keeps on the trainer's GPU between pushes, only where the
engine's record says it reuses them."""

from __future__ import annotations

import pytest

from slime.plan.derive import derive
from slime.plan.memory import estimate_memory
from slime.plan.sync_memory import STAGING_BUFFERS
from tests.helpers.compose import typed_config

RUN = ["model=qwen3_4b", "parallelism=fsdp", "debug.gpu_memory_gib=80", "cluster.colocate=true"]


def test_kept_staging_buffers_are_counted_where_the_trainer_holds_them():
    from slime.sync.staging import SLOTS

    assert STAGING_BUFFERS == SLOTS
    cfg = typed_config([*RUN, "rollout=hf", "rollout.weight_sync.mode=tensor", "rollout.weight_sync.bucket_mb=512"])
    est = estimate_memory(cfg, derive(cfg))
    width = 2 if derive(cfg).precision == "bf16" else 4
    embedding = cfg.model.vocab_size * cfg.model.hidden_size * width
    assert est.train["sync_staging"] == pytest.approx(2 * ((512 << 20) + embedding))
    without = typed_config([*RUN, "rollout=hf", "rollout.weight_sync.mode=disk"])
    assert estimate_memory(without, derive(without)).train["sync_staging"] == 0.0
    # held beside the trainer's state while the colocated engine generates
    assert est.train_state - estimate_memory(without, derive(without)).train_state == pytest.approx(
        est.train["sync_staging"]
    )


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_engines_given_fresh_buffers_hold_none_between_pushes(engine):
    cfg = typed_config([*RUN, f"rollout={engine}", "rollout.weight_sync.mode=tensor"])
    assert estimate_memory(cfg, derive(cfg)).train["sync_staging"] == 0.0
