"""The actors of one engine: one actor and server, or, for an engine spanning nodes, one per node slice.

An engine wider than a node runs a server per node with the engine's multi-node arguments (`EngineLaunch.node_slice`):
node rank 0 serves the API and is the engine's URL (registered with the router, probed, sent every control call and
weight sync: its rank 0 passes them to every TP rank); node ranks >= 1 serve only a health probe (SGLang) or no HTTP
at all (vLLM's headless nodes). They meet at the rendezvous address (`--dist-init-addr`; vLLM's `--master-addr` /
`--master-port`), a free port on node rank 0's node. Node rank 0 becomes ready only once every node has joined,
so the followers start first; stopping node rank 0 stops the others (SGLang's ShutdownReq broadcast), and their own
actors then reap them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import ray

from slime.engine.base import EngineLaunch, NodeSlice
from slime.rollout.manager.bundles import EnginePlacement, Placement, free_address_on


@dataclasses.dataclass
class EngineActors:
    """The Ray actors of one engine: `main` (node rank 0, or the whole engine) and its node followers."""

    main: Any
    followers: list[Any] = dataclasses.field(default_factory=list)

    def start_refs(self) -> list:
        """Start every server (followers first: node rank 0 waits for them); one ref per actor, main's first."""
        followers = [actor.start.remote() for actor in self.followers]
        return [self.main.start.remote(), *followers]


def create_engine_actors(
    spawn: Callable[[Placement, EngineLaunch], Any], launch: EngineLaunch, placement: EnginePlacement
) -> EngineActors:
    """The engine's actors on `placement` (not started): `spawn(bundle, launch)` creates one on its node slice's first
    bundle, `launch` narrowed to the slice's GPUs and node rank when the engine spans nodes."""
    slices = placement.node_slices()
    if len(slices) == 1:
        return EngineActors(main=spawn(placement.first, launch))
    host, port = free_address_on(slices[0].first)
    actors = []
    for node_rank, part in enumerate(slices):
        span = NodeSlice(num_nodes=len(slices), node_rank=node_rank, dist_init_addr=f"{host}:{port}")
        actors.append(
            spawn(
                part.first,
                dataclasses.replace(launch, gpu_ids=part.gpu_ids, node_slice=span, node_ip=part.first.node_ip),
            )
        )
    return EngineActors(main=actors[0], followers=actors[1:])


def ask_each(groups: list[list[Any]], method: str) -> list[list]:
    """Per group of actors (an engine's, node rank 0 first), their answers to `method()`, all asked at once."""
    answers = iter(ray.get([getattr(actor, method).remote() for actors in groups for actor in actors]))
    return [[next(answers) for _ in actors] for actors in groups]


def get_failing_fast(refs: list) -> list:
    """`ray.get(refs)`, except that the first error raises as soon as its ref ends, not after every ref before it:
    one engine (or one node's server) that dies while the others still load fails the start at once, with its log."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done)
    return ray.get(refs)
