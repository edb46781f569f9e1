"""Which bundle of the run's placement group each role gets: pure arithmetic, no Ray.

`create_placement` (placement.py) applies it to the bundles Ray reserved, sorted by (node IP, GPU id);
the dry run (slime.tracking.dry_run) applies it to the bundles such a sort gives on empty identical
nodes under the PACK strategy: bundle i on node i // num_gpus_per_node, GPU i % num_gpus_per_node.
Disaggregated: actor (+ critic) bundles first, then rollout bundles; colocated: rollout engines share
the actor's bundles (REFERENCE.md §2.1).
"""

from __future__ import annotations

import dataclasses

from slime.config.derived import Derived


@dataclasses.dataclass(frozen=True)
class RolePlan:
    """Positions in the sorted bundle list, per role."""

    actor: list[int]  # training rank r -> its bundle
    critic: list[int]  # PPO's critic ranks (the actor's bundles when it shares them)
    engines: list[list[int]]  # engine e -> its consecutive bundles


def assign_roles(derived: Derived, *, colocate: bool, engine_gpus: list[int], critic_with_actor: bool) -> RolePlan:
    """Engine e gets the next `engine_gpus[e]` rollout bundles (the engine specs' sizes, in their order)."""
    a, c = derived.actor_gpus, derived.critic_gpus
    actor = list(range(a))
    critic = actor if critic_with_actor else list(range(a, a + c))
    rollout_start = 0 if colocate else a + c
    engines, first = [], rollout_start
    for size in engine_gpus:
        engines.append(list(range(first, first + size)))
        first += size
    return RolePlan(actor=actor, critic=critic, engines=engines)


def packed_device(index: int, gpus_per_node: int) -> tuple[int, int]:
    """(node, GPU) of bundle `index` when PACK fills empty identical nodes in order."""
    return index // gpus_per_node, index % gpus_per_node
