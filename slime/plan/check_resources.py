"""Resources: GPU arithmetic and the placement of roles, checked on the derived values before anything starts.

(Options a chosen part cannot honour are that part's check: slime.registry names them.)"""

from __future__ import annotations

from collections.abc import Iterator

from slime.algo.estimators import ESTIMATORS
from slime.config.derived import Derived
from slime.config.problems import Problem, get
from slime.config.schema import RunConfig
from slime.engine.groups import group_problems
from slime.net import WILDCARD_HOSTS


def check_cluster(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    """GPU arithmetic: every role's devices fit the cluster and split into engines and DP ranks."""
    c = cfg.cluster
    for key in (
        "cluster.num_nodes",
        "cluster.num_gpus_per_node",
        "cluster.actor.num_nodes",
        "cluster.actor.num_gpus_per_node",
        "cluster.rollout.num_gpus_per_engine",
    ):
        if get(cfg, key) < 1:
            yield Problem(key, get(cfg, key), "must be >= 1", f"set {key}=1 or more")
    if c.actor.num_nodes > c.num_nodes:
        yield Problem(
            "cluster.actor.num_nodes",
            c.actor.num_nodes,
            f"the cluster has {c.num_nodes} node(s)",
            f"set cluster.actor.num_nodes<={c.num_nodes} or cluster.num_nodes",
        )
    if c.actor.num_gpus_per_node > c.num_gpus_per_node:
        yield Problem(
            "cluster.actor.num_gpus_per_node",
            c.actor.num_gpus_per_node,
            f"a node has {c.num_gpus_per_node} GPU(s) (cluster.num_gpus_per_node)",
            f"set cluster.actor.num_gpus_per_node<={c.num_gpus_per_node}",
        )
    yield from _check_engines(cfg, derived)
    capacity = c.num_nodes * c.num_gpus_per_node
    if derived.total_gpus > capacity:
        yield Problem(
            "cluster.actor.num_gpus_per_node",
            c.actor.num_gpus_per_node,
            f"the run needs {derived.total_gpus} GPU(s) (actor {derived.actor_gpus} + critic {derived.critic_gpus}"
            f" + rollout {0 if c.colocate else derived.rollout_gpus}{', colocated' if c.colocate else ''}) "
            f"but the cluster has {c.num_nodes} × {c.num_gpus_per_node} = {capacity}",
            "lower cluster.actor.num_gpus_per_node / cluster.rollout.num_gpus, set cluster.colocate=true, "
            "or pick a larger cluster=...",
        )
    yield from check_critic_resources(cfg, derived)
    g = cfg.train.global_batch_size
    if g is not None and derived.dp_size >= 1 and g % derived.dp_size:
        yield Problem(
            "train.global_batch_size",
            g,
            f"must split evenly over {derived.dp_size} data-parallel ranks",
            f"use a multiple of {derived.dp_size}",
        )
    yield from _check_local_devices(cfg, derived)


def _check_engines(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    """The rollout GPUs split into engines (or into the server groups of `rollout.models`)."""
    c = cfg.cluster
    if (
        not cfg.rollout.models
        and c.rollout.num_gpus_per_engine >= 1
        and derived.rollout_gpus % c.rollout.num_gpus_per_engine
    ):
        yield Problem(
            "cluster.rollout.num_gpus",
            derived.rollout_gpus,
            f"not a multiple of cluster.rollout.num_gpus_per_engine={c.rollout.num_gpus_per_engine}",
            "make cluster.rollout.num_gpus a multiple of num_gpus_per_engine",
        )
    for key, value, message, fix in group_problems(cfg, derived.rollout_gpus):
        yield Problem(key, value, message, fix)
    if (
        c.rollout.num_gpus_per_engine >= 1
        and derived.rollout_gpus < c.rollout.num_gpus_per_engine
        and not cfg.rollout.models
    ):
        yield Problem(
            "cluster.rollout.num_gpus",
            c.rollout.num_gpus,
            "no rollout engine fits",
            f"set cluster.rollout.num_gpus>={c.rollout.num_gpus_per_engine}",
        )


def _check_local_devices(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    """A CUDA run without a Ray cluster needs the GPUs on this machine."""
    c = cfg.cluster
    if c.device == "cuda" and c.ray_address is None:
        local = _local_cuda_count()
        if local < min(derived.total_gpus, c.num_gpus_per_node):
            yield Problem(
                "cluster.device",
                c.device,
                f"the run needs {derived.total_gpus} GPU(s) (cluster.num_gpus_per_node={c.num_gpus_per_node}) but "
                f"this machine has {local} CUDA device(s) and no Ray cluster was given (cluster.ray_address)",
                "run on a GPU node, set cluster.ray_address=<head address> to join a GPU cluster, "
                "or cluster=local_cpu to run on CPU",
                machine=True,
            )


def check_model_parallel_split(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    """The actor's GPUs split into tp·pp·cp model-parallel groups."""
    p = cfg.parallelism
    model_parallel = p.tp * p.pp * p.cp
    if model_parallel and derived.actor_gpus % model_parallel:
        yield Problem(
            "parallelism.tp",
            p.tp,
            f"actor GPUs ({derived.actor_gpus}) are not divisible by tp·pp·cp = {model_parallel}",
            "choose tp, pp, cp whose product divides the actor GPU count",
        )


def check_critic_resources(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    c, estimator = cfg.cluster.critic, ESTIMATORS.find(cfg.algo.advantage_estimator)
    if estimator is None:
        return  # an unknown estimator: reported by slime/plan/validate.py
    if not estimator.needs_critic:
        if c.num_gpus_per_node:
            critics = ESTIMATORS.names(where=lambda e: e.needs_critic)
            yield Problem(
                "cluster.critic.num_gpus_per_node",
                c.num_gpus_per_node,
                f"only {', '.join(critics)} trains a critic; algo.advantage_estimator={cfg.algo.advantage_estimator!r} would leave "
                "these GPUs idle",
                "set cluster.critic.num_gpus_per_node=null",
            )
        return
    if not c.colocate_with_actor and derived.critic_gpus == 0:
        yield Problem(
            "cluster.critic.num_gpus_per_node",
            c.num_gpus_per_node,
            "ppo needs a critic but it has no GPUs",
            "set cluster.critic.num_gpus_per_node=null (as many as the actor) or "
            "cluster.critic.colocate_with_actor=true",
        )
    elif derived.critic_gpus and derived.critic_gpus != derived.actor_gpus:
        yield Problem(
            "cluster.critic.num_gpus_per_node",
            c.num_gpus_per_node,
            f"the critic must mirror the actor's {derived.actor_gpus} GPU(s) (same data-parallel layout)",
            "set cluster.critic.num_nodes/num_gpus_per_node=null",
        )


def _local_cuda_count() -> int:
    try:
        import torch  # optional library: torch (imported only for a CUDA run without a Ray cluster)

        return torch.cuda.device_count()
    except Exception:  # torch missing or broken CUDA: treat as no GPU
        return 0


def check_host_on_several_nodes(cfg: RunConfig) -> Iterator[Problem]:
    """On several nodes every server binds all interfaces and is reached at its node's IP (slime.net.reached_at): one
    node's address (or a loopback one) cannot be bound, or reached, on the others."""
    c = cfg.cluster
    if c.num_nodes > 1 and c.host not in WILDCARD_HOSTS:
        yield Problem(
            "cluster.host",
            c.host,
            f"one node's address with cluster.num_nodes={c.num_nodes}: the servers of the other nodes cannot bind it "
            "(a loopback address: nothing off their node reaches them)",
            "set cluster.host=0.0.0.0 (each server is then reached at its node's IP)",
        )
