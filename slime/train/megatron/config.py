"""The megatron backend's options section, `parallelism.megatron`: what its spec (slime/train/megatron/spec.py)
adds to the run's schema (slime/run_schema.py). Torch-free and megatron-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
class MegatronOptions:
    """The keys the megatron backend adds to `parallelism`."""

    # Extra megatron-core config fields (TransformerConfig, OptimizerConfig, ...), checked against megatron-core
    megatron: dict[str, Any] = field(default_factory=dict)
