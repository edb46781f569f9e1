"""Validation of the vllm engine's config: the checks of its registry record (slime.registry.ENGINES), run by
slime/plan/validate.py before anything starts. vllm itself is never imported here (engine_args reads the
pinned field list, or the installed wheel's parser).

    rollout.vllm   vLLM server arguments the framework does not own (slime.engine.vllm.engine_args); also every
                   server group's `overrides`, and `prefill_num_servers` (slime's --prefill-num-servers)
    on CPU         what a vLLM server on CPU cannot do (slime.engine.vllm.cpu)
    the router     vllm-router's own parser
"""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.routing_replay import RoutingReplay
from slime.config.schema import RunConfig
from slime.engine.check import RouterKind, check_router_args
from slime.engine.groups import group_overrides, rollout_gpu_count
from slime.engine.vllm.cpu import CPU_ATTENTION_HEAD_SIZES
from slime.engine.vllm.engine_args import LAUNCH_MODULE, check_engine_args, router_flags, tensor_parallel_size
from slime.engine.vllm.router import VLLMRouter
from slime.registry import WEIGHT_SYNC

VLLM_ROUTER = RouterKind(name="vllm-router", flags=router_flags, health_switches=VLLMRouter.health_switches)


def check(cfg: RunConfig) -> Iterator[Problem]:
    """rollout.engine=vllm: the server arguments, what a CPU server cannot do, the weight check, the router."""
    yield from check_vllm_args(cfg)
    if cfg.cluster.device == "cpu" and cfg.rollout.vllm_launch.module == LAUNCH_MODULE:
        # vLLM's own server only: a stand-in server (the tests' fake of a GPU vLLM) decides what it can do
        yield from check_vllm_on_cpu(cfg)
    if cfg.debug.check_weight_update_equal:
        yield Problem(
            "debug.check_weight_update_equal",
            True,
            "the check drives SGLang's /weights_checker (snapshot, reset_tensors, compare, checksum); vLLM 0.32.0's "
            "/weight_checker (checksum, reset, compare against a baseline the caller keeps) is not wired to it",
            "set debug.check_weight_update_equal=false with rollout.engine=vllm",
        )
    yield from check_router_args(cfg, VLLM_ROUTER)


def check_unchosen(cfg: RunConfig) -> Iterator[Problem]:
    """Another engine is chosen: `rollout.vllm` does nothing (its keys are still checked)."""
    base = dict(cfg.rollout.vllm)
    if base:
        yield Problem(
            "rollout.vllm",
            base,
            f"vLLM server arguments do nothing with rollout.engine={cfg.rollout.engine}",
            "remove them or use the vllm engine (rollout=vllm)",
        )
    yield from _engine_arg_problems("rollout.vllm", base)


def check_vllm_args(cfg: RunConfig) -> Iterator[Problem]:
    """`rollout.vllm` and every server group's `overrides`: vLLM server arguments the framework does not own;
    the parallel sizes each server ends up with must split its GPUs."""
    base = dict(cfg.rollout.vllm)
    problems = _engine_arg_problems("rollout.vllm", base)
    yield from problems
    # (the key holding the server's arguments, those arguments, the key deciding its GPUs, their number)
    servers = [("rollout.vllm", base, *_cluster_gpus(cfg))]
    if cfg.rollout.models:
        servers = []
        groups = [group for model in cfg.rollout.models for group in model.server_groups]
        for (prefix, overrides), group in zip(group_overrides(cfg), groups):
            group_problems = _engine_arg_problems(prefix, overrides)
            yield from group_problems
            own = prefix.replace(".overrides", ".num_gpus_per_engine")
            gpus = (own, group.num_gpus_per_engine) if group.num_gpus_per_engine else _cluster_gpus(cfg)
            if not group_problems:  # sizes of a wrong type are reported above
                servers.append((prefix, {**base, **overrides}, *gpus))
    if not problems:
        yield from _split_problems(servers)
        yield from _prefill_problems(cfg)


def _cluster_gpus(cfg: RunConfig) -> tuple[str, int]:
    return "cluster.rollout.num_gpus_per_engine", cfg.cluster.rollout.num_gpus_per_engine


def _engine_arg_problems(prefix: str, args: dict) -> list[Problem]:
    issues = check_engine_args(args, prefix=prefix)
    return [Problem(i.key, args[i.key.rpartition(".")[2]], i.message, i.fix) for i in issues]


def _prefill_problems(cfg: RunConfig) -> Iterator[Problem]:
    """`rollout.vllm.prefill_num_servers` (slime's --prefill-num-servers) leaves at least one decode server."""
    n, key = cfg.rollout.vllm.get("prefill_num_servers"), "rollout.vllm.prefill_num_servers"
    if not n:
        return
    if cfg.rollout.models:
        yield Problem(
            key,
            n,
            "rollout.models sets each server group's worker type itself",
            f"remove {key}; give the groups worker_type: prefill / decode",
        )
        return
    servers = rollout_gpu_count(cfg) // max(cfg.cluster.rollout.num_gpus_per_engine, 1)
    if n >= servers:
        yield Problem(
            key,
            n,
            f"leaves no decode server: the policy has {servers} server(s)",
            f"set {key} below {servers}, or give the rollout more GPUs (cluster.rollout.num_gpus)",
        )


def _split_problems(servers: list[tuple[str, dict, str, int]]) -> Iterator[Problem]:
    for prefix, args, gpus_key, num_gpus in servers:
        if num_gpus <= 0:
            continue  # reported by the resource checks
        try:
            tensor_parallel_size(num_gpus, args)
        except ValueError as exc:
            yield Problem(
                prefix, args, f"{gpus_key}={num_gpus}: {exc}", f"pick parallel sizes whose product divides {gpus_key}"
            )


def check_vllm_on_cpu(cfg: RunConfig) -> Iterator[Problem]:
    """What a vLLM server on CPU cannot do (slime.engine.vllm.cpu): receive weights but from disk, sleep for a
    colocated trainer, attend over head sizes its CPU kernel lacks."""
    mode = cfg.rollout.weight_sync.mode
    why = WEIGHT_SYNC.facts(mode).cpu_blocker
    if why is not None:
        yield Problem(
            "rollout.weight_sync.mode",
            mode,
            f"a vLLM server on CPU cannot take {mode} weight syncs: {why}",
            "set rollout.weight_sync.mode=disk",
        )
    if cfg.cluster.colocate:
        yield Problem(
            "cluster.colocate",
            True,
            "a vLLM server on CPU refuses --enable-sleep-mode, which colocation needs",
            "set cluster.colocate=false",
        )
    head_dim = cfg.model.kv_channels
    if head_dim not in CPU_ATTENTION_HEAD_SIZES:
        yield Problem(
            "model.kv_channels",
            head_dim,
            f"vLLM's CPU attention takes head sizes {list(CPU_ATTENTION_HEAD_SIZES)}; this model's is {head_dim} "
            "(the server would die on its first request)",
            "pick a model whose head size it takes, e.g. model=tiny_qwen3_vllm, or run the engine on GPUs",
        )
    if RoutingReplay.named(cfg.algo.routing_replay) is RoutingReplay.ROLLOUT:
        yield Problem(
            "algo.routing_replay",
            cfg.algo.routing_replay,
            "vLLM 0.32.0 returns routed experts only from its model runner V2 (vllm/config/vllm.py), which needs "
            "Triton: a vLLM server on CPU cannot",
            "set algo.routing_replay=train (the trainer's own routes), or rollout.engine=hf on CPU",
        )
