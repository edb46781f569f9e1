"""Where an actor of the run goes: a bundle of the run's placement group (`Placement`), an engine's consecutive bundles
(`EnginePlacement`), and a free address on a bundle's node for a rendezvous there. The driver reserves and locates the
bundles (slime.driver.placement) and places the trainer ranks on them; the rollout manager receives its engines'
`EnginePlacement`s and starts the engine actors on them (engine_nodes.py).
"""

from __future__ import annotations

import dataclasses

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime.net import free_port


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one actor goes: a bundle of the run's placement group, and that bundle's GPU."""

    group: PlacementGroup
    bundle_index: int
    device: str  # cuda | cpu
    gpu_id: str | None = None  # the physical GPU id Ray assigned to the bundle (cuda)
    node_id: str | None = None  # the Ray node holding the bundle
    sort_position: int = 0  # the bundle's place in the run's (node IP, node id, GPU) order
    node_ip: str | None = None  # that node's IP, where a server bound to a wildcard cluster.host is reached

    def actor_options(self, *, fraction: float) -> dict:
        """Ray options for an actor taking `fraction` (1.0: all) of this bundle's device."""
        resources = {"num_gpus": fraction, "num_cpus": fraction} if self.device == "cuda" else {"num_cpus": fraction}
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.bundle_index
        )
        return {**resources, "scheduling_strategy": strategy}


@dataclasses.dataclass(frozen=True)
class EnginePlacement:
    """An engine's `cluster.rollout.num_gpus_per_engine` consecutive bundles: its actor lives on the first,
    its server process uses the GPUs of all of them."""

    bundles: tuple[Placement, ...]

    @property
    def first(self) -> Placement:
        return self.bundles[0]

    @property
    def gpu_ids(self) -> tuple[str, ...]:
        return tuple(b.gpu_id for b in self.bundles if b.gpu_id is not None)

    def node_slices(self) -> list[EnginePlacement]:
        """The engine's bundles per node, in order: one slice for an engine inside a node, one per node for an engine
        spanning nodes (a server each)."""
        slices: dict[str | None, list[Placement]] = {}
        for bundle in self.bundles:
            slices.setdefault(bundle.node_id, []).append(bundle)
        return [EnginePlacement(tuple(bundles)) for bundles in slices.values()]


def _free_address() -> tuple[str, int]:
    """This node's IP and a free TCP port on it."""
    return ray.util.get_node_ip_address(), free_port("")  # "": free on every interface of this node


def free_address_on(place: Placement) -> tuple[str, int]:
    """A free (IP, port) on the node of `place`, for a rendezvous there (torch.distributed's, SGLang's
    --dist-init-addr): found right here when that is this process's node, else by a task there."""
    if place.node_id == ray.get_runtime_context().get_node_id():
        return _free_address()
    task = ray.remote(num_cpus=0)(_free_address).options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=place.group, placement_group_bundle_index=place.bundle_index
        )
    )
    return ray.get(task.remote())
