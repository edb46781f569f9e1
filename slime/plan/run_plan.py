"""The RunPlan: what a launch of a resolved config executes, computed once (slime.plan.resolve).

The driver reserves `roles.num_bundles` bundles, places each role on its bundles, launches `engines` and
builds the training group with `layout`; the dry run prints the same plan. Nothing here starts anything.
"""

from __future__ import annotations

import dataclasses

from slime.algo.estimators import ESTIMATORS
from slime.config.derived import Derived
from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.engine.groups import EngineSpec, ModelSpec, engine_specs, model_specs
from slime.plan.memory import MemoryEstimate, estimate_memory
from slime.plan.roles import RolePlan, assign_roles
from slime.train.layout import RankLayout


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunPlan:
    """Resource and batch arithmetic, served models, one spec per engine, each role's bundles, the training
    ranks' layout and the per-GPU memory estimate of a run."""

    derived: Derived  # batch and resource arithmetic (GPU counts are CPU slots when cluster.device=cpu)
    models: tuple[ModelSpec, ...]  # served models; the first updatable one is the policy
    engines: tuple[EngineSpec, ...]  # one per engine, in GPU order
    roles: RolePlan  # bundle positions of the actor, critic and engines
    layout: RankLayout  # the training group's ranks (the critic mirrors the actor's)
    critic: bool  # PPO's critic group runs
    memory: MemoryEstimate | None  # per-GPU estimate (GiB arithmetic in slime.plan.memory); None on CPU
    still_needs: tuple[Problem, ...] = ()  # inputs absent here that a real launch needs (dry run only)

    def table(self) -> list[tuple[str, str]]:
        """(name, value) rows printed at start-up: the derived values, the engine count after the GPU counts."""
        rows = self.derived.table()
        at = [name for name, _ in rows].index("total_gpus") + 1
        return [*rows[:at], ("num_engines", str(len(self.engines))), *rows[at:]]


def plan_run(cfg: RunConfig, derived: Derived, *, still_needs: tuple[Problem, ...] = ()) -> RunPlan:
    """The plan of a validated config (`derived` = derive(cfg)); `still_needs` as `resolve` found them."""
    c, p = cfg.cluster, cfg.parallelism
    engines = tuple(engine_specs(cfg, derived.rollout_gpus))
    critic = ESTIMATORS.get(cfg.algo.advantage_estimator).needs_critic
    roles = assign_roles(
        derived,
        colocate=c.colocate,
        engine_gpus=[spec.num_gpus for spec in engines],
        critic=critic,
        critic_with_actor=critic and c.critic.colocate_with_actor,
    )
    return RunPlan(
        derived=derived,
        models=tuple(model_specs(cfg)),
        engines=engines,
        roles=roles,
        layout=RankLayout.for_world(derived.actor_gpus, tp=p.tp, cp=p.cp, pp=p.pp, ep=p.ep, etp=p.etp),
        critic=critic,
        memory=estimate_memory(cfg, derived) if c.device == "cuda" else None,
        still_needs=still_needs,
    )
