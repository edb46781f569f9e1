"""One placement group over every device a run needs, bundles in a stable (node, GPU id) order.

GPU clusters get `{GPU: 1, CPU: 1}` bundles; `cluster.device=cpu` gets `{CPU: 1}` bundles and the
same code runs. Where each bundle landed comes from a probe task per bundle on GPU clusters (only a
task learns which GPU Ray gave its bundle) and from the placement group table on CPU (no worker
process to start). Which role gets which bundle is the RunPlan's `roles` (slime.plan.roles), which the dry run
prints.
"""

from __future__ import annotations

import dataclasses

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime.config.problems import ConfigError, Problem
from slime.net import LOOPBACK_HOSTS
from slime.plan.roles import RolePlan
from slime.rollout.manager.bundles import EnginePlacement, Placement


@ray.remote(num_cpus=0)
def _probe() -> tuple[str, str, list]:
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), [str(g) for g in ray.get_gpu_ids()]


def _locate(group: PlacementGroup, count: int, device: str) -> list[tuple[str, str, list]]:
    """(node id, node IP, GPU ids) of each bundle of `group`."""
    if device == "cuda":
        return ray.get(
            [  # a GPU share makes Ray report the bundle's GPU id
                _probe.options(
                    num_gpus=0.01,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=group, placement_group_bundle_index=i
                    ),
                ).remote()
                for i in range(count)
            ]
        )
    nodes = placement_group_table(group)["bundles_to_node_id"]
    ips = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    return [(nodes[i], ips[nodes[i]], []) for i in range(count)]


def _ip_key(ip: str) -> tuple:
    parts = ip.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (ip,)


@dataclasses.dataclass
class RunPlacement:
    """Every role's bundles in the run's one placement group."""

    group: PlacementGroup
    actor: list[Placement]
    critic: list[Placement]  # PPO's critic: its own bundles, or the actor's when colocated with it
    rollout: list[EnginePlacement]  # one entry per engine

    def nodes(self) -> list[str]:
        """The Ray node ids holding the run's bundles, in the sorted order (the dry run's node 0, 1, ...)."""
        ordered = [*self.actor, *self.critic, *(b for engine in self.rollout for b in engine.bundles)]
        ordered.sort(key=lambda p: p.sort_position)
        return list(dict.fromkeys(p.node_id for p in ordered))

    def describe(self) -> dict:
        """`<run dir>/placement.json`: each trainer rank's and engine's node (index into `nodes`, and id) and GPU."""
        index = {node: i for i, node in enumerate(self.nodes())}

        def where(p: Placement) -> dict:
            return {
                "node": index[p.node_id],
                "node_id": p.node_id,
                "node_ip": p.node_ip,
                "gpu": p.gpu_id,
                "bundle": p.bundle_index,
            }

        return {
            "nodes": self.nodes(),
            "actor": [where(p) for p in self.actor],
            "critic": [where(p) for p in self.critic],
            "engines": [[where(b) for b in engine.bundles] for engine in self.rollout],
        }

    def check_reachable(self, host: str) -> None:
        """Servers bound to a loopback `cluster.host` answer only on their own node; a role on another node than the
        driver's (where the router runs) could not reach them, nor they it: stopped here, naming the key."""
        if host not in LOOPBACK_HOSTS:
            return
        here = ray.get_runtime_context().get_node_id()
        away = sorted({p.node_id for p in (*self.actor, *self.critic, *(b for e in self.rollout for b in e.bundles))})
        away = [node for node in away if node != here]
        if away:
            where = f"Ray placed roles of this run on {len(away)} node(s) other than the driver's"
            raise ConfigError(
                [
                    Problem(
                        "cluster.host",
                        host,
                        f"{where} ({', '.join(node[:12] for node in away)}), where a server bound to a loopback "
                        "address is not reached",
                        "set cluster.host=0.0.0.0 (each server is then reached at its node's IP)",
                    )
                ]
            )


PLACEMENT_TIMEOUT_S = 120.0  # seconds the bundles may take to be reserved


def create_placement(roles: RolePlan, *, device: str) -> RunPlacement:
    """Reserve `roles.num_bundles` bundles (strategy PACK), locate each one (node IP, GPU id), sort, and place
    each role on the sorted bundles its RolePlan names."""
    count, timeout_s = roles.num_bundles, PLACEMENT_TIMEOUT_S
    bundle = {"GPU": 1, "CPU": 1} if device == "cuda" else {"CPU": 1}
    group = placement_group([dict(bundle) for _ in range(count)], strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        raise TimeoutError(
            f"placement group of {count} {bundle} bundles not ready after {timeout_s}s: "
            f"cluster resources are {ray.cluster_resources()}"
        )
    located = _locate(group, count, device)
    # node id after IP: raylets sharing a host (a local multi-node cluster) still keep their bundles together
    order = sorted(range(count), key=lambda i: (_ip_key(located[i][1]), located[i][0], located[i][2], i))
    places = [
        Placement(
            group,
            i,
            device,
            located[i][2][0] if located[i][2] else None,
            located[i][0],
            position,
            node_ip=located[i][1],
        )
        for position, i in enumerate(order)
    ]
    return RunPlacement(
        group=group,
        actor=[places[i] for i in roles.actor],
        critic=[places[i] for i in roles.critic],
        rollout=[EnginePlacement(tuple(places[i] for i in bundles)) for bundles in roles.engines],
    )
