"""A group of training ranks: one Ray actor per rank wrapping the configured backend class."""

from __future__ import annotations

import socket

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime.runtime.placement import Placement
from slime.train.base import TrainSetup, get_backend_class
from slime.types import TrainBatch


@ray.remote(num_cpus=0)
def _rendezvous_address() -> tuple[str, int]:
    """Node IP and a free TCP port on rank 0's node for torch.distributed's rendezvous."""
    with socket.socket() as sock:  # bound then released: a tiny race, as every TCP rendezvous has
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return ray.util.get_node_ip_address(), port


class TrainGroup:
    """One role's ranks (actor or critic); calls go to every rank and return every rank's result."""

    def __init__(self, setup: TrainSetup, placements: list[Placement], role: str = "actor"):
        actor_cls = ray.remote(get_backend_class(setup.parallelism.backend, role))
        first = placements[0]
        addr, port = ray.get(_rendezvous_address.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=first.group, placement_group_bundle_index=first.bundle_index)).remote())
        self.actors = [
            actor_cls.options(**place.actor_options(fraction=0.4)).remote(
                setup, rank=rank, world_size=len(placements), master_addr=addr, master_port=port)
            for rank, place in enumerate(placements)
        ]

    def init(self) -> int:
        """Build models on every rank; return the first rollout id (identical on all ranks)."""
        starts = ray.get([a.init.remote() for a in self.actors])
        if len(set(starts)) != 1:
            raise RuntimeError(f"training ranks disagree on the start rollout: {starts}")
        return starts[0]

    def _per_rank(self, batches: list[TrainBatch]) -> None:
        if len(batches) != len(self.actors):
            raise RuntimeError(f"{len(batches)} batches for {len(self.actors)} data-parallel ranks")

    def train(self, rollout_id: int, batches: list[TrainBatch], **kwargs) -> list[dict]:
        """Every rank's result, in rank order (step metrics are identical on all ranks after the all-reduce)."""
        self._per_rank(batches)
        return ray.get([a.train.remote(rollout_id, b, **kwargs) for a, b in zip(self.actors, batches)])

    def compute_values(self, batches: list[TrainBatch]) -> list[list[list[float]]]:
        """Critic only: per rank, per sample, the value of every response token."""
        self._per_rank(batches)
        return ray.get([a.compute_values.remote(b) for a, b in zip(self.actors, batches)])

    def save_hf(self, path: str) -> None:
        ray.get([a.save_hf.remote(path) for a in self.actors])

    def save_checkpoint(self, rollout_id: int, root: str) -> None:
        ray.get([a.save_checkpoint.remote(rollout_id, root) for a in self.actors])

    def shutdown(self) -> None:
        for actor in self.actors:
            try:
                ray.get(actor.shutdown.remote(), timeout=30)
            except Exception:  # a dead rank must not block teardown
                pass
            ray.kill(actor)
        self.actors = []
