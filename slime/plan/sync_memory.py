"""The weight sync's own GPU memory on the trainer (per GPU, bytes; from the config alone, no torch).

Tensor mode into an engine that reuses its staging buffers (`EngineFacts.reuses_tensor_buffers`: the hf engine)
keeps two staging buffers on the source training rank from its first push until the sync is closed
(`slime.sync.staging`), so they sit beside the trainer's state while a colocated engine generates and while the
trainer trains. Each holds at least a bucket (`rollout.weight_sync.bucket_mb`) and grows to the largest bucket it
carried; a bucket holds less than the bucket size plus its last tensor, so each is below the bucket size plus the
largest tensor (the embedding, V·H in the trainer's precision). Other engines get a fresh buffer per bucket, two at
most at once during a push and freed after it, and an adapter-only sync (`model.lora` synced alone) moves its two
small buckets the same way: nothing held between pushes.
"""

from __future__ import annotations

from slime.config.derived import Derived
from slime.config.schema import RunConfig
from slime.registry import ENGINES

STAGING_BUFFERS = 2  # slime.sync.staging.SLOTS: one bucket being loaded, the next one being packed


def staging_bytes(cfg: RunConfig, derived: Derived) -> float:
    """Bytes the staging buffers hold on the source rank's GPU between pushes (0 where none are kept)."""
    sync = cfg.rollout.weight_sync
    if sync.mode != "tensor" or cfg.model.lora.synced_alone:
        return 0.0
    if not ENGINES.facts(cfg.rollout.engine).reuses_tensor_buffers:
        return 0.0
    largest_tensor = cfg.model.vocab_size * cfg.model.hidden_size * (2 if derived.precision == "bf16" else 4)
    return float(STAGING_BUFFERS * ((sync.bucket_mb << 20) + largest_tensor))
