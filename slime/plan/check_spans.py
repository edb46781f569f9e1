"""Engines wider than a node: which engines of the plan span nodes, and whether the chosen engine can run them.

An engine of `cluster.rollout.num_gpus_per_engine` GPUs takes consecutive bundles (slime.plan.roles); where they
cross a node boundary the engine is one server per node slice, started with the engine record's `node_span_flags`
(SGLang: `--nnodes`, `--node-rank`, `--dist-init-addr` on the first node; vLLM: `--nnodes`, `--node-rank`,
`--master-addr` / `--master-port`, `--headless` past the first). Both split tp evenly over the nodes, so every slice
must hold the same number of GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.schema import RunConfig
from slime.plan.roles import RolePlan, node_slices
from slime.plan.run_plan import RunPlan
from slime.registry import ENGINES

KEY = "cluster.rollout.num_gpus_per_engine"


def spanning_engines(roles: RolePlan, gpus_per_node: int) -> dict[int, dict[int, tuple[int, ...]]]:
    """engine index -> {node: its GPUs there} for every engine whose GPUs lie on more than one node."""
    slices = {e: node_slices(bundles, gpus_per_node) for e, bundles in enumerate(roles.engines)}
    return {e: nodes for e, nodes in slices.items() if len(nodes) > 1}


def check_engine_spans(cfg: RunConfig, plan: RunPlan) -> Iterator[Problem]:
    """An engine spanning nodes needs an engine kind that runs across nodes, and equal slices. Read off the plan, so the
    problems come after validation's (slime.plan.resolve)."""
    c = cfg.cluster
    spans = spanning_engines(plan.roles, c.num_gpus_per_node)
    if not spans:
        return
    value, first = c.rollout.num_gpus_per_engine, min(spans)
    nodes = sorted(spans[first])
    where = f"engine {first}'s GPUs lie on nodes {nodes[0]}-{nodes[-1]} ({c.num_gpus_per_node} GPUs a node)"
    if ENGINES.facts(cfg.rollout.engine).node_span_flags is None:
        kinds = [name for name in ENGINES.names() if ENGINES.facts(name).node_span_flags is not None]
        yield Problem(
            KEY,
            value,
            f"{where}, and rollout.engine={cfg.rollout.engine} runs each server inside one node",
            f"set {KEY} to a divisor of cluster.num_gpus_per_node={c.num_gpus_per_node} that divides the "
            f"{plan.roles.engines[0][0]} GPU(s) before the engines too, or rollout.engine={' or '.join(kinds)}",
        )
    elif any(len({len(gpus) for gpus in span.values()}) > 1 for span in spans.values()):
        yield Problem(
            KEY,
            value,
            f"{where} in unequal slices; an engine spanning nodes splits its tensor parallelism evenly over them",
            f"make {KEY} a multiple of cluster.num_gpus_per_node={c.num_gpus_per_node} (and the GPUs before the "
            "engines a multiple of it)",
        )
