"""The built-in engine's options section, `rollout.hf`: what its spec (slime/engine/hf/spec.py) adds to the run's
schema (slime/run_schema.py). Torch-free: the standard library and the config leaf only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(kw_only=True)
class HFEngineConfig:
    """The built-in transformers server (`rollout.engine=hf`)."""

    # sequences decoded together; None: 256, or 1 with rollout.deterministic on cuda or with num_threads > 1 (where
    # its batch-invariant forward passes do not run)
    max_batch_size: Optional[int] = None
    batch_wait_ms: float = 5.0  # how long the batcher waits for more requests
    dtype: str = "auto"  # auto (bf16 on cuda, fp32 on cpu) | float32 | bfloat16
    num_threads: int = 1  # torch threads per CPU engine
    prefix_cache_tokens: int = 8192  # prompt tokens of one-request prefills kept for reuse; 0: no prefix cache
    # on cuda, decode on a preallocated KV cache with each step one CUDA graph replay (docs/engines.md); false: the
    # dynamic cache, as on cpu
    cuda_graphs: bool = True
    startup_timeout_s: float = 120.0


@dataclass(kw_only=True)
class HFEngineOptions:
    """The keys the built-in engine adds to `rollout`."""

    hf: HFEngineConfig = field(default_factory=HFEngineConfig)
