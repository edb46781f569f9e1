"""The rollout manager's setup (slime.rollout.setup.RolloutSetup) built from the run's config and plan, once, in the
driver (the manager actor never sees the whole RunConfig)."""

from __future__ import annotations

from pathlib import Path

from slime.config.async_mode import AsyncMode, StalePolicy
from slime.config.routing_replay import RoutingReplay
from slime.config.schema import RunConfig
from slime.config.schema_lora import LoRAConfig
from slime.engine.base import LoRAServing
from slime.engine.fleet_setup import FleetSetup
from slime.plan.run_plan import RunPlan
from slime.rollout.base import StreamLimits
from slime.rollout.setup import RolloutSetup


def rollout_setup(cfg: RunConfig, plan: RunPlan) -> RolloutSetup:
    """What the driver hands the rollout manager: the run config's parts it reads and the plan's engines."""
    derived = plan.derived
    return RolloutSetup(
        rollout=cfg.rollout,
        data=cfg.data,
        eval=cfg.eval,
        algo=cfg.algo,
        model_path=cfg.model.hf_checkpoint,
        host=cfg.cluster.host,
        device=cfg.cluster.device,
        colocate=cfg.cluster.colocate,
        seed=cfg.seed,
        log_dir=cfg.paths.output_dir,
        dp_size=derived.dp_size,
        global_batch_size=derived.global_batch_size,
        num_steps_per_rollout=cfg.train.num_steps_per_rollout,
        balance_tokens=cfg.parallelism.max_tokens_per_gpu is not None,
        fleet=FleetSetup(
            rollout=cfg.rollout,
            models=list(plan.models),
            specs=list(plan.engines),
            host=cfg.cluster.host,
            device=cfg.cluster.device,
            colocate=cfg.cluster.colocate,
            seed=cfg.seed,
            run_dir=cfg.paths.output_dir,
            trainer_gpus=derived.actor_gpus,
            dtype={"fp32": "float32", "bf16": "bfloat16"}.get(derived.precision, "auto"),
            return_routed_experts=RoutingReplay(cfg.algo.routing_replay).engine_returns_routes,
            lora=lora_serving(cfg.model.lora),
        ),
        save_rollout_data=cfg.debug.save_rollout_data,
        # an adapter sync leaves the base as loaded: nothing to snapshot, randomise and compare (its adapters are
        # checked tensor by tensor as they load: slime.sync.adapter)
        check_weight_update_equal=cfg.debug.check_weight_update_equal and not cfg.model.lora.synced_alone,
        load_rollout_data=(str(Path(cfg.debug.load_rollout_data).resolve()) if cfg.debug.load_rollout_data else None),
        max_train_groups=max_train_groups(cfg),
        stream=stream_limits(cfg),
    )


def stream_limits(cfg: RunConfig) -> StreamLimits | None:
    """train.async=full's bounds; None for the other loops."""
    if cfg.train.async_mode is not AsyncMode.FULL:
        return None
    return StreamLimits(
        batch_size=cfg.rollout.batch_size,
        max_staleness=cfg.train.max_staleness,
        regenerate_stale=StalePolicy(cfg.rollout.stale_policy) is StalePolicy.REGENERATE,
        keep_failed=cfg.rollout.fault_tolerance.enabled,
    )


def lora_serving(lora: LoRAConfig) -> LoRAServing | None:
    """How the policy's engines serve its LoRA adapter when each sync moves the adapter alone (else None)."""
    if not lora.synced_alone:
        return None
    return LoRAServing(max_rank=lora.rank, target_modules=tuple(lora.target_modules))


def max_train_groups(cfg: RunConfig) -> int | None:
    """The fresh groups of the whole run when train.num_epoch sized it (num_rollout × batch_size), else None."""
    if cfg.train.num_epoch is None or cfg.train.num_rollout is None:
        return None
    return cfg.train.num_rollout * cfg.rollout.batch_size
