"""Served models and their server groups, flattened into one `EngineSpec` per engine.

`rollout.models` (slime's `--sglang-config`) lists the served models; each has its own router and
groups of `regular | prefill | decode` servers with GPU counts and per-group ServerArgs overrides. An
empty list means one model, the policy ("default"), with one regular group on every rollout GPU. The
rollout GPUs are handed out in list order: model by model, group by group, engine by engine.

No Ray, no torch: validation (GPU counts), the driver (placement sizes) and the rollout manager (what
to launch) all read the same specs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Optional

from slime.registry import ENGINES

if TYPE_CHECKING:
    from slime.config.schema import RouterConfig, RunConfig

DEFAULT_MODEL = "default"
WORKER_TYPES = ("regular", "prefill", "decode")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One served model: its name, HF dir, router settings and whether weight syncs reach it."""

    name: str
    model_path: str
    update_weights: bool
    router: RouterConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """One engine: the model it serves, its worker type, its GPU count and ServerArgs overrides."""

    model: str
    worker_type: str
    num_gpus: int
    overrides: dict[str, Any]
    key: str  # "models[i].server_groups[j]": where a problem with this engine comes from


def model_specs(cfg: RunConfig) -> list[ModelSpec]:
    """The served models; the first updatable one is the policy the default rollout function samples from."""
    r = cfg.rollout
    if not r.models:
        return [ModelSpec(name=DEFAULT_MODEL, model_path=cfg.model.hf_checkpoint, update_weights=True, router=r.router)]
    return [
        ModelSpec(
            name=m.name,
            model_path=m.model_path or cfg.model.hf_checkpoint,
            update_weights=m.update_weights,
            router=m.router if m.router.address or i else _merged_router(r.router, m.router),
        )
        for i, m in enumerate(r.models)
    ]


def _merged_router(top: RouterConfig, own: RouterConfig) -> RouterConfig:
    """The first model's router: `rollout.router.address` (an external router) applies to it."""
    return own if own.address or not top.address else dataclasses.replace(own, address=top.address)


def rollout_gpu_count(cfg: RunConfig) -> int:
    """GPUs the engines share: the actor's when colocated, else `cluster.rollout.num_gpus`."""
    c = cfg.cluster
    return c.actor.num_nodes * c.actor.num_gpus_per_node if c.colocate else c.rollout.num_gpus


def engine_specs(cfg: RunConfig, rollout_gpus: int) -> list[EngineSpec]:
    """One spec per engine, in GPU order; groups whose GPUs do not split into engines give a spec of
    the group's remainder size (validation reports it, see `group_problems`)."""
    r, per_engine = cfg.rollout, max(cfg.cluster.rollout.num_gpus_per_engine, 1)
    if not r.models:
        count, prefill = rollout_gpus // per_engine, _prefill_num_servers(cfg)
        kinds = ["regular"] * count if not prefill else ["prefill"] * prefill + ["decode"] * (count - prefill)
        return [
            EngineSpec(model=DEFAULT_MODEL, worker_type=kind, num_gpus=per_engine, overrides={}, key="cluster")
            for kind in kinds
        ]
    specs = []
    for i, model in enumerate(r.models):
        for j, group in enumerate(model.server_groups):
            size = max(group.num_gpus_per_engine or per_engine, 1)
            for _ in range(max(group.num_gpus, 0) // size):
                specs.append(
                    EngineSpec(
                        model=model.name,
                        worker_type=group.worker_type,
                        num_gpus=size,
                        overrides=dict(group.overrides),
                        key=f"rollout.models[{i}].server_groups[{j}]",
                    )
                )
    return specs


def _prefill_num_servers(cfg: RunConfig) -> int:
    """`rollout.vllm.prefill_num_servers` (slime's --prefill-num-servers): PD without `rollout.models`
    (validation, slime.engine.vllm.check, checks it leaves a decode server)."""
    if not ENGINES.facts(cfg.rollout.engine).prefill_decode_groups:
        return 0
    value = cfg.rollout.vllm.get("prefill_num_servers") or 0
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def group_overrides(cfg: RunConfig) -> list[tuple[str, dict[str, Any]]]:
    """(config key, ServerArgs overrides) of every server group of `rollout.models`, in list order."""
    return [
        (f"rollout.models[{i}].server_groups[{j}].overrides", dict(group.overrides))
        for i, model in enumerate(cfg.rollout.models)
        for j, group in enumerate(model.server_groups)
    ]


def group_problems(cfg: RunConfig, rollout_gpus: int) -> list[tuple[str, Any, str, str]]:
    """(key, value, what is wrong, how to fix it) for every inconsistent served-model setting."""
    r = cfg.rollout
    problems: list[tuple[str, Any, str, str]] = []  # their URLs' form: slime.config.validate_addresses
    if not r.models:
        return problems
    names = [m.name for m in r.models]
    if len(set(names)) != len(names):
        problems.append(("rollout.models", names, "model names repeat", "give every served model its own name"))
    if not any(m.update_weights for m in r.models):
        problems.append(
            ("rollout.models", names, "no model has update_weights=true", "mark the policy update_weights: true")
        )
    total = 0
    for i, model in enumerate(r.models):
        problems += _model_problems(i, model, cfg)
        total += sum(max(group.num_gpus, 0) for group in model.server_groups)
    if total != rollout_gpus:
        problems.append(
            (
                "rollout.models",
                total,
                f"the server groups' num_gpus add up to {total}, but the rollout has {rollout_gpus} GPU(s) "
                "(cluster.rollout.num_gpus; the actor's GPUs when colocated)",
                f"make the groups' num_gpus add up to {rollout_gpus}, or set cluster.rollout.num_gpus={total}",
            )
        )
    return problems


def _model_problems(i: int, model: Any, cfg: RunConfig) -> list[tuple[str, Any, str, str]]:
    """Problems of `rollout.models[i]`: servers present, each group sound, regular or PD (both halves)."""
    problems: list[tuple[str, Any, str, str]] = []
    if not model.server_groups and not (i == 0 and cfg.rollout.external_engines):
        problems.append((f"rollout.models[{i}].server_groups", [], "a model needs servers", "add a server group"))
    for j, group in enumerate(model.server_groups):
        key = f"rollout.models[{i}].server_groups[{j}]"
        problems += _group_problems(key, group, cfg.cluster.rollout.num_gpus_per_engine)
    kinds = sorted({g.worker_type for g in model.server_groups})
    if ("prefill" in kinds) != ("decode" in kinds):
        problems.append(
            (
                f"rollout.models[{i}].server_groups",
                kinds,
                "PD disaggregation needs both prefill and decode groups",
                "add the missing prefill or decode group, or use worker_type: regular",
            )
        )
    if "regular" in kinds and len(kinds) > 1:
        problems.append(
            (
                f"rollout.models[{i}].server_groups",
                kinds,
                "a model's router is either regular or PD (prefill + decode), not both",
                "serve regular and PD groups as two models",
            )
        )
    return problems


def _group_problems(key: str, group: Any, default_per_engine: int) -> list[tuple[str, Any, str, str]]:
    """A group's worker type and GPU split (whether the engine serves PD groups is the engine's own check)."""
    problems: list[tuple[str, Any, str, str]] = []
    if group.worker_type not in WORKER_TYPES:
        problems.append(
            (f"{key}.worker_type", group.worker_type, "unknown worker type", f"use one of {', '.join(WORKER_TYPES)}")
        )
    size = group.num_gpus_per_engine or default_per_engine
    if group.num_gpus < 1 or size < 1 or group.num_gpus % size:
        problems.append(
            (
                f"{key}.num_gpus",
                group.num_gpus,
                f"must be a positive multiple of the group's GPUs per engine ({size})",
                f"set {key}.num_gpus to a multiple of {size}, or change its num_gpus_per_engine",
            )
        )
    return problems


def policy_model(models: list[ModelSpec]) -> Optional[ModelSpec]:
    """The first updatable model: the one the default rollout function and weight syncs use."""
    return next((m for m in models if m.update_weights), None)
