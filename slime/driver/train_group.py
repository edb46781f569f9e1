"""A group of training ranks: one Ray actor per rank wrapping the configured backend class.

The backend class is imported on the rank's own process (`TrainRank`), never by the driver: a
training stack is torch and more, ~2 CPU-seconds the driver would spend before its first actor starts. The
driver imports the interface alone (`slime.train.base.TrainBackend`), whose functions name the calls it sends.

The group's `RankLayout` decides who gets what: data-parallel shard d goes to every rank whose
`dp_rank` is d (its whole model-parallel group), and each per-shard result is read from the rank that
owns it (`layout.owner_of(d)`). Every call reaches every rank, in the same order.

Training data flows one way, by reference: the rollout manager puts each shard into Ray's object store,
and the group passes shard d's reference to each of its ranks as a top-level argument, which Ray resolves
on the rank (from the store: the driver never fetches a shard; the ranks of one shard read one object).
Per-shard columns (the critic's values, the actor's returns) leave their owner rank the same way: as a
reference the other group's ranks receive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ray

from slime.registry import TRAIN_BACKENDS
from slime.rollout.manager.bundles import Placement, free_address_on
from slime.rollout.manager.stack_dump import arm_stack_dump
from slime.rollout.manager.worker_logging import configure_worker_logging
from slime.train.base import BackendMethod, TrainBackend, call_backend
from slime.train.layout import RankLayout
from slime.train.train_setup import TrainSetup


class TrainRank:
    """One training rank as a Ray actor: builds the registered backend for `role` and runs its methods."""

    def __init__(self, setup: TrainSetup, role: str, **rank_args: Any):
        arm_stack_dump()
        configure_worker_logging()  # its records reach logs/workers.log and the terminal (slime.rollout.manager)
        self.backend = TRAIN_BACKENDS.load(setup.parallelism.backend, role)(setup, **rank_args)

    def call(self, method: BackendMethod, *args: Any, **kwargs: Any) -> Any:
        """`method` (a backend class's function, e.g. `TrainBackend.train`) on this rank's backend."""
        return call_backend(self.backend, method, *args, **kwargs)

    def node_id(self) -> str:
        """The Ray node this rank's process runs on."""
        return ray.get_runtime_context().get_node_id()

    def execute(self, fn: Callable[[], Any]) -> Any:
        """Run a driver-given function in this rank's process (slime.driver.fault_injection's hang)."""
        return fn()

    def execute_on_backend(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(backend)` in this rank's process (slime.driver.fault_injection's gradient poison)."""
        return fn(self.backend)

    def put_owned(self, method: BackendMethod, *args: Any) -> ray.ObjectRef | None:
        """`method(*args)`; on the rank that owns the shard's results (`RankLayout.owner_of`), the result put
        into the object store, its reference returned; None from the others (their copies stay here)."""
        result = self.call(method, *args)
        layout, rank = self.backend.layout, self.backend.rank
        return ray.put(result) if layout.owner_of(layout.shard_of(rank)) == rank else None

    def __repr__(self) -> str:  # Ray prefixes the rank's log lines with it
        return f"{type(self.backend).__name__}(rank={self.backend.rank})"


class TrainGroup:
    """One role's ranks (actor or critic), `layout.world_size` actors in rank order; `launch` starts them."""

    def __init__(self, layout: RankLayout, actors: list[Any]):
        if layout.world_size != len(actors):
            raise ValueError(f"a layout of {layout.world_size} ranks for {len(actors)} rank actors")
        self.layout = layout
        self.actors = actors

    @classmethod
    def launch(
        cls,
        setup: TrainSetup,
        placements: list[Placement],
        layout: RankLayout,
        *,
        role: str = "actor",
        fraction: float = 0.4,
    ) -> TrainGroup:
        """A `TrainRank` actor per placement (rank order), each on `fraction` of its bundle's accelerator."""
        if layout.world_size != len(placements):
            raise ValueError(f"a layout of {layout.world_size} ranks for {len(placements)} placements")
        addr, port = free_address_on(placements[0])
        actors = [
            ray.remote(TrainRank)
            .options(**place.actor_options(fraction=fraction))
            .remote(setup, role, rank=rank, layout=layout, master_addr=addr, master_port=port)
            for rank, place in enumerate(placements)
        ]
        return cls(layout, actors)

    def node_ids(self) -> list[str]:
        """The Ray node of each rank's process, in rank order."""
        return ray.get([a.node_id.remote() for a in self.actors])

    # ---- dispatch ----------------------------------------------------------------------------
    def _all(self, method: BackendMethod, *args, **kwargs) -> list[Any]:
        return ray.get([a.call.remote(method, *args, **kwargs) for a in self.actors])

    def _per_shard(self, method: BackendMethod, per_shard: Sequence[ray.ObjectRef], *args) -> list[Any]:
        """Call `method(*args, value of per_shard[dp_rank])` on every rank; return every rank's result.

        The reference is a top-level argument, so Ray resolves it on the rank, from the object store."""
        if len(per_shard) != self.layout.dp:
            raise RuntimeError(f"{len(per_shard)} shards for {self.layout.dp} data-parallel ranks")
        if not all(isinstance(ref, ray.ObjectRef) for ref in per_shard):
            raise TypeError(
                f"{method.__name__}: per-shard data goes to the ranks by reference (ray.ObjectRef), not by value"
            )
        return ray.get(
            [a.call.remote(method, *args, per_shard[self.layout.shard_of(rank)]) for rank, a in enumerate(self.actors)]
        )

    def _owned_refs(self, method: BackendMethod, *args) -> list[ray.ObjectRef]:
        """Call `method(*args)` on every rank; per shard, the reference to its owner's result, which that rank
        put into the object store (the driver receives references only)."""
        answers = ray.get([a.put_owned.remote(method, *args) for a in self.actors])
        return [answers[rank] for rank in self.layout.owners()]

    def _owned(self, results: list[Any]) -> list[Any]:
        """Per shard, the result of the rank that owns it."""
        return [results[rank] for rank in self.layout.owners()]

    # ---- the interface, group-wide -----------------------------------------------------------
    def begin_init(self) -> list[ray.ObjectRef]:
        """Start building models on every rank (two groups can build at once); then `finish_init`."""
        return [actor.call.remote(TrainBackend.init) for actor in self.actors]

    def finish_init(self, pending: list[ray.ObjectRef]) -> int:
        """Wait for `begin_init`'s ranks; return the first rollout id (identical on all ranks)."""
        starts = ray.get(pending)
        if len(set(starts)) != 1:
            raise RuntimeError(f"training ranks disagree on the start rollout: {starts}")
        return starts[0]

    def load_batch(self, rollout_id: int, shards: Sequence[ray.ObjectRef]) -> None:
        """Every rank loads its shard's `TrainBatch` (`shards[d]`: the rollout manager's reference to shard d)."""
        self._per_shard(TrainBackend.load_batch, shards, rollout_id)

    def compute_log_probs(self, which: str) -> dict[str, float]:
        return self._owned(self._all(TrainBackend.compute_log_probs, which))[0]

    def compute_values(self) -> list[ray.ObjectRef]:
        """Critic: per shard, a reference to its values (per sample, the value of every response token)."""
        return self._owned_refs(TrainBackend.compute_values)

    def compute_advantages(self) -> dict[str, float]:
        return self._owned(self._all(TrainBackend.compute_advantages))[0]

    def set_column(self, name: str, per_shard: Sequence[ray.ObjectRef]) -> None:
        """Every rank sets column `name` from its shard's per-sample lists (`per_shard[d]`, a reference)."""
        self._per_shard(TrainBackend.set_column, per_shard, name)

    def get_column(self, name: str) -> list[ray.ObjectRef]:
        """Per shard, a reference to column `name` as per-sample lists (e.g. the actor's returns)."""
        return self._owned_refs(TrainBackend.get_column, name)

    def train(self, *, update: bool = True) -> dict:
        """{"steps": [...], "perf": {...}} of the first shard's owner (step metrics are reduced over ranks)."""
        return self._owned(self._all(TrainBackend.train, update=update))[0]

    def connect_weight_sync(self, mode: str, engine_urls: list[str], context) -> None:
        self._all(TrainBackend.connect_weight_sync, mode, engine_urls, context)

    def update_weights(self, weight_version: int) -> dict[str, float]:
        return self._all(TrainBackend.update_weights, weight_version)[0]

    def weights_verified(self) -> dict[str, float]:
        """The last push's check, awaited where it runs beside generation (TrainBackend.weights_verified)."""
        return self._all(TrainBackend.weights_verified)[0]

    def offload(self) -> None:
        """Free accelerator memory for colocated engines (every rank)."""
        self._all(TrainBackend.offload)

    def onload(self) -> None:
        self._all(TrainBackend.onload)

    def save_hf(self, path: str) -> None:
        self._all(TrainBackend.save_hf, path)

    def save_checkpoint(self, rollout_id: int, root: str) -> None:
        self._all(TrainBackend.save_checkpoint, rollout_id, root)

    def run_on_rank(self, rank: int, fn: Callable[[], Any]) -> Any:
        """`fn()` in rank `rank`'s process; waits for its result."""
        return ray.get(self.actors[rank].execute.remote(fn))

    def run_on_backends(self, fn: Callable[[Any], Any]) -> list[Any]:
        """`fn(backend)` on every rank, in its process; waits for the results."""
        return ray.get([actor.execute_on_backend.remote(fn) for actor in self.actors])

    def shutdown(self, *, graceful: bool = True) -> None:
        """Each rank's backend shuts down (unless not `graceful`: a hung rank never answers), then is killed."""
        for actor in self.actors:
            try:
                if graceful:
                    ray.get(actor.call.remote(TrainBackend.shutdown), timeout=30)
            except Exception:  # a dead rank must not block teardown
                pass
            ray.kill(actor)
        self.actors = []
