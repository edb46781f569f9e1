"""Which bundle of the run's placement group each role gets: pure arithmetic, no Ray.

`create_placement` (slime.driver.placement) applies it to the bundles Ray reserved, sorted by (node IP,
GPU id); the dry run (slime.plan.dry_run) applies it to the bundles such a sort gives on empty identical
nodes under the PACK strategy: bundle i on node i // num_gpus_per_node, GPU i % num_gpus_per_node.
Disaggregated: actor (+ critic) bundles first, then rollout bundles; colocated: rollout engines share
the actor's bundles (docs/clusters.md#placement).
"""

from __future__ import annotations

import dataclasses

from slime.config.derived import Derived


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolePlan:
    """Positions in the sorted bundle list, per role."""

    num_bundles: int  # bundles the placement group reserves (one per GPU; per CPU slot on CPU)
    actor: tuple[int, ...]  # training rank r -> its bundle
    critic: tuple[int, ...]  # PPO's critic ranks (the actor's bundles when it shares them); () without a critic
    engines: tuple[tuple[int, ...], ...]  # engine e -> its consecutive bundles


def assign_roles(
    derived: Derived, *, colocate: bool, engine_gpus: list[int], critic: bool, critic_with_actor: bool
) -> RolePlan:
    """Engine e gets the next `engine_gpus[e]` rollout bundles (the engine specs' sizes, in their order).
    `critic`: the run has PPO's critic group; `critic_with_actor`: it shares the actor's bundles."""
    a, c = derived.actor_gpus, derived.critic_gpus
    actor = tuple(range(a))
    critic_bundles = () if not critic else actor if critic_with_actor else tuple(range(a, a + c))
    engines, first = [], 0 if colocate else a + c
    for size in engine_gpus:
        engines.append(tuple(range(first, first + size)))
        first += size
    return RolePlan(num_bundles=derived.total_gpus, actor=actor, critic=critic_bundles, engines=tuple(engines))


def packed_device(index: int, gpus_per_node: int) -> tuple[int, int]:
    """(node, GPU) of bundle `index` when PACK fills empty identical nodes in order."""
    return index // gpus_per_node, index % gpus_per_node


def node_slices(bundles: tuple[int, ...], gpus_per_node: int) -> dict[int, tuple[int, ...]]:
    """node -> the GPUs of `bundles` (one engine's) on it, in node order under PACK: one entry for an engine inside a
    node, one per node slice for an engine spanning nodes."""
    slices: dict[int, list[int]] = {}
    for bundle in bundles:
        node, gpu = packed_device(bundle, gpus_per_node)
        slices.setdefault(node, []).append(gpu)
    return {node: tuple(gpus) for node, gpus in slices.items()}
