"""One placement group over every device a run needs, bundles in a stable (node, GPU id) order.

GPU clusters get `{GPU: 1, CPU: 1}` bundles; `cluster.device=cpu` gets `{CPU: 1}` bundles and the
same code runs. Disaggregated: actor (+critic) bundles first, then rollout bundles; colocated:
rollout engines share the actor's bundles (REFERENCE.md §2.1).
"""

from __future__ import annotations

import dataclasses

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime.config.derive import Derived


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one actor goes: a bundle of the run's placement group."""

    group: PlacementGroup
    bundle_index: int
    device: str  # cuda | cpu

    def actor_options(self, *, fraction: float) -> dict:
        """Ray options for an actor taking `fraction` of this bundle's device (colocation-friendly)."""
        resources = {"num_gpus": fraction, "num_cpus": fraction} if self.device == "cuda" else {"num_cpus": fraction}
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=self.bundle_index)
        return {**resources, "scheduling_strategy": strategy}


@ray.remote(num_cpus=0)
def _probe() -> tuple[str, list]:
    return ray.util.get_node_ip_address(), [str(g) for g in ray.get_gpu_ids()]


def _ip_key(ip: str) -> tuple:
    parts = ip.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (ip,)


@dataclasses.dataclass
class RunPlacement:
    group: PlacementGroup
    actor: list[Placement]
    critic: list[Placement]  # PPO's critic: its own bundles, or the actor's when colocated with it
    rollout: list[Placement]  # the first bundle of each engine


def create_placement(derived: Derived, *, device: str, colocate: bool, gpus_per_engine: int, critic_with_actor: bool,
                     timeout_s: float = 120) -> RunPlacement:
    """Reserve the bundles (strategy PACK), probe each bundle's (node IP, GPU id), sort, and assign roles."""
    bundle = {"GPU": 1, "CPU": 1} if device == "cuda" else {"CPU": 1}
    group = placement_group([dict(bundle) for _ in range(derived.total_gpus)], strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        raise TimeoutError(f"placement group of {derived.total_gpus} {bundle} bundles not ready after {timeout_s}s: "
                           f"cluster resources are {ray.cluster_resources()}")
    probes = [
        _probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group,
                                                                            placement_group_bundle_index=i)).remote()
        for i in range(derived.total_gpus)
    ]
    located = ray.get(probes)
    order = sorted(range(derived.total_gpus), key=lambda i: (_ip_key(located[i][0]), located[i][1], i))
    places = [Placement(group, i, device) for i in order]
    actor = places[: derived.actor_gpus]
    critic = actor if critic_with_actor else places[derived.actor_gpus : derived.actor_gpus + derived.critic_gpus]
    rollout_start = 0 if colocate else derived.actor_gpus + derived.critic_gpus
    rollout_places = places[rollout_start : rollout_start + derived.rollout_gpus]
    return RunPlacement(group=group, actor=actor, critic=critic, rollout=rollout_places[::gpus_per_engine])
