"""The run's stack in words: its training backend and rollout engine (their registry records' `kind`), and what
their processes run on. The dry run (slime/plan/dry_run.py) and the plan summary a run prints when it starts
(slime/plan/plan_summary.py) say the same lines.

On `cluster.device=cpu` a bundle of the placement group is a CPU slot holding one worker process (a trainer rank or
an engine server): counts are said in workers there, never in GPUs.
"""

from __future__ import annotations

from slime.config.schema import RunConfig
from slime.plan.run_plan import RunPlan
from slime.registry import ENGINES, TRAIN_BACKENDS


def on_cpu(cfg: RunConfig) -> bool:
    return cfg.cluster.device != "cuda"


def count(n: int, cfg: RunConfig) -> str:
    """'1 GPU', '4 GPUs'; on CPU '1 worker', '4 workers'."""
    unit = "worker" if on_cpu(cfg) else "GPU"
    return f"{n} {unit}{'s' * (n != 1)}"


def _kind(registry, name: str, role: str | None = None) -> str:
    """The record's `kind`, or its import path when it says none (a name registered by a user)."""
    return registry.facts(name).kind or registry.target(name, role)


def trainer_line(cfg: RunConfig, plan: RunPlan) -> str:
    """'fsdp (PyTorch FSDP2 over a transformers model): 1 worker, dp 1, fp32'."""
    if cfg.debug.rollout_only:
        return "none (debug.rollout_only: the engines generate and score with the initial weights)"
    backend, layout, derived = cfg.parallelism.backend, plan.layout, plan.derived
    parallel = f"dp {layout.dp}" + "".join(
        f" x {name} {size}" for name, size in (("tp", layout.tp), ("pp", layout.pp), ("cp", layout.cp)) if size > 1
    )
    line = f"{backend} ({_kind(TRAIN_BACKENDS, backend, 'actor')}): {count(derived.actor_gpus, cfg)}, {parallel}"
    line += f", {derived.precision}"
    if plan.critic:
        critic = derived.critic_gpus
        line += f"; critic on {count(critic, cfg) if critic else 'the same ' + count(derived.actor_gpus, cfg)}"
    return line


def engine_line(cfg: RunConfig, plan: RunPlan) -> str:
    """'hf (built-in transformers server): 1 engine x 1 worker, behind sglang-router (launched)'."""
    r = cfg.rollout
    if cfg.debug.load_rollout_data is not None:
        return f"none (debug.load_rollout_data: rollouts replayed from {cfg.debug.load_rollout_data})"
    what = f"{r.engine} ({_kind(ENGINES, r.engine)})"
    if r.external_engines:
        return f"{what}: {len(r.external_engines)} external server(s) (rollout.external_engines), not started here"
    shapes: dict[tuple[str, int], int] = {}
    for spec in plan.engines:
        shapes[spec.model, spec.num_gpus] = shapes.get((spec.model, spec.num_gpus), 0) + 1
    named = bool(r.models)
    engines = ", ".join(
        f"{n} engine{'s' * (n != 1)} x {count(size, cfg)}" + (f" ({model})" if named else "")
        for (model, size), n in shapes.items()
    )
    behind = r.router.address or f"{ENGINES.facts(r.engine).router} (launched)"
    return f"{what}: {engines or 'no engine'}, behind {behind}"


def resources_line(cfg: RunConfig, plan: RunPlan) -> str:
    """What the placement group reserves: 'CPU, 1 node: trainer workers 1, engine workers 1 (disaggregated)', or
    '8 GPUs of 1 node x 8: trainer GPUs 4, engine GPUs 4 (disaggregated)'."""
    c, d = cfg.cluster, plan.derived
    placement = "colocated" if c.colocate else "disaggregated"
    parts = [("trainer", d.actor_gpus), ("critic", d.critic_gpus), ("engine", d.rollout_gpus)]
    nodes = f"{c.num_nodes} node{'s' * (c.num_nodes != 1)}"
    unit = "workers" if on_cpu(cfg) else "GPUs"
    held = ", ".join(f"{name} {unit} {n}" for name, n in parts if n)
    if on_cpu(cfg):
        return f"CPU, {nodes}: {held} ({placement})"
    return f"{count(d.total_gpus, cfg)} of {nodes} x {c.num_gpus_per_node}: {held} ({placement})"


def stack_lines(cfg: RunConfig, plan: RunPlan) -> list[str]:
    """The dry run's section naming the backend and the engine."""
    return [
        "Stack:",
        f"  trainer: {trainer_line(cfg, plan)}",
        f"  engine: {engine_line(cfg, plan)}",
        f"  resources: {resources_line(cfg, plan)}",
    ]
