"""What the rollout manager's engines need from the run config (slime.rollout.manager.engine_fleet builds them from
it)."""

from __future__ import annotations

import dataclasses

from slime.config.schema import RolloutConfig
from slime.engine.base import LoRAServing
from slime.engine.groups import EngineSpec, ModelSpec


@dataclasses.dataclass(frozen=True, kw_only=True)
class FleetSetup:
    """What the fleet needs from the run config."""

    rollout: RolloutConfig
    models: list[ModelSpec]
    specs: list[EngineSpec]
    host: str
    device: str
    colocate: bool
    seed: int
    run_dir: str
    trainer_gpus: int  # the actor's ranks; colocated, training rank i shares rollout bundle i
    dtype: str = "auto"  # the trainer's precision as a torch dtype name (EngineLaunch.dtype)
    return_routed_experts: bool = False  # the policy's engines return MoE routes (EngineLaunch.return_routed_experts)
    lora: LoRAServing | None = None  # the policy's engines serve its LoRA adapter (EngineLaunch.lora)
