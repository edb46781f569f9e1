"""Resources and parts: GPU arithmetic, the placement of roles, and options the chosen parts cannot honour."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.derive import Derived
from slime.config.problems import Problem, get
from slime.config.schema import FSDPOptions, RunConfig
from slime.engine.groups import group_problems

MIXED_PRECISION_MODES = ("fsdp2", "autocast")


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
    if derived.num_engines < 1 and c.rollout.num_gpus_per_engine >= 1 and not cfg.rollout.models:
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


def check_parts_honour_options(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    """Options the chosen backend and engine cannot honour are rejected, not ignored."""
    p = cfg.parallelism
    model_parallel = p.tp * p.pp * p.cp
    if derived.actor_gpus % model_parallel:
        yield Problem(
            "parallelism.tp",
            p.tp,
            f"actor GPUs ({derived.actor_gpus}) are not divisible by tp·pp·cp = {model_parallel}",
            "choose tp, pp, cp whose product divides the actor GPU count",
        )
    if p.max_tokens_per_gpu is not None and p.max_tokens_per_gpu < 1:
        yield Problem(
            "parallelism.max_tokens_per_gpu",
            p.max_tokens_per_gpu,
            "must be > 0 (tokens per micro-batch)",
            "set parallelism.max_tokens_per_gpu to a positive token count, or null for micro_batch_size",
        )
    if cfg.train.ref_offload and not (cfg.algo.use_kl_loss or cfg.algo.kl_coef != 0):
        yield Problem(
            "train.ref_offload",
            True,
            "there is no reference model to offload (algo.use_kl_loss=false and algo.kl_coef=0)",
            "set train.ref_offload=false, or use a KL term",
        )
    if p.backend == "fsdp":
        yield from check_fsdp_options(cfg)
    elif p.fsdp != FSDPOptions():
        yield Problem(
            "parallelism.fsdp",
            p.fsdp,
            f"options of the fsdp backend, but parallelism.backend={p.backend!r}",
            "remove the parallelism.fsdp.* overrides, or use parallelism=fsdp",
        )
    if cfg.rollout.engine == "hf":
        yield from check_hf_engine_options(cfg)
    if cfg.rollout.engine == "vllm" and cfg.cluster.device == "cpu" and _is_vllms_own(cfg.rollout.vllm_launch.module):
        yield from check_vllm_on_cpu(cfg)
    yield from check_weight_sync(cfg)


def check_fsdp_options(cfg: RunConfig) -> Iterator[Problem]:
    """The fsdp backend splits by data and tensor parallelism; tp must divide the split dimensions."""
    p = cfg.parallelism
    for key in ("pp", "cp", "ep", "etp"):
        if getattr(p, key) != 1:
            yield Problem(
                f"parallelism.{key}",
                getattr(p, key),
                "the fsdp backend splits models by data and tensor parallelism only",
                f"set parallelism.{key}=1 or parallelism=megatron",
            )
    m = cfg.model
    for key in ("num_attention_heads", "num_query_groups", "ffn_hidden_size"):
        if p.tp > 1 and getattr(m, key) % p.tp:
            yield Problem(
                "parallelism.tp",
                p.tp,
                f"tensor parallelism splits model.{key}={getattr(m, key)} evenly over the tp ranks",
                f"pick a parallelism.tp dividing {getattr(m, key)}",
            )
    if p.sequence_parallel:
        yield Problem(
            "parallelism.sequence_parallel",
            True,
            "sequence parallelism needs tensor parallelism (megatron)",
            "set parallelism.sequence_parallel=false",
        )
    if p.fsdp.mixed_precision not in MIXED_PRECISION_MODES:
        yield Problem(
            "parallelism.fsdp.mixed_precision",
            p.fsdp.mixed_precision,
            f"unknown mode; expected one of {', '.join(MIXED_PRECISION_MODES)}",
            "set parallelism.fsdp.mixed_precision=fsdp2 (bf16 compute over fp32 shards) or autocast",
        )


def check_hf_engine_options(cfg: RunConfig) -> Iterator[Problem]:
    """The built-in engine: one device, and one request at a time when deterministic."""
    c = cfg.cluster
    if cfg.rollout.deterministic and (cfg.rollout.hf.max_batch_size or 1) > 1:
        yield Problem(
            "rollout.hf.max_batch_size",
            cfg.rollout.hf.max_batch_size,
            "with rollout.deterministic=true the hf engine decodes each request on its own (batch-invariant)",
            "set rollout.hf.max_batch_size=null, or rollout.deterministic=false to batch requests",
        )
    if c.rollout.num_gpus_per_engine != 1:
        yield Problem(
            "cluster.rollout.num_gpus_per_engine",
            c.rollout.num_gpus_per_engine,
            "the built-in hf engine runs on one device",
            "set cluster.rollout.num_gpus_per_engine=1",
        )


def _is_vllms_own(module: str) -> bool:
    """Whether the servers are vLLM's own entry point (a stand-in server, such as the tests' fake of a GPU vLLM,
    decides for itself what it can do)."""
    from slime.engine.vllm.engine_args import LAUNCH_MODULE

    return module == LAUNCH_MODULE


def check_vllm_on_cpu(cfg: RunConfig) -> Iterator[Problem]:
    """What a vLLM server on CPU cannot do (slime.engine.vllm.cpu): receive weights but from disk, sleep for a
    colocated trainer, attend over head sizes its CPU kernel lacks."""
    from slime.engine.vllm.cpu import CPU_ATTENTION_HEAD_SIZES

    mode = cfg.rollout.weight_sync.mode
    if mode != "disk":
        why = {"tensor": "its IPC transfer and sleep mode need an accelerator"}.get(
            mode, "its weight-transfer engine needs an accelerator"
        )
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


def check_weight_sync(cfg: RunConfig) -> Iterator[Problem]:
    """`keep` is disk-only; tensor mode needs the engines on the trainer's node and devices; checksums need SGLang/hf."""
    c, ws = cfg.cluster, cfg.rollout.weight_sync
    if ws.keep and ws.mode != "disk":
        yield Problem(
            "rollout.weight_sync.keep",
            True,
            f"only disk mode writes weight directories to keep; mode={ws.mode!r}",
            "set rollout.weight_sync.keep=false or rollout.weight_sync.mode=disk",
        )
    if ws.mode == "tensor" and not c.colocate:
        yield Problem(
            "rollout.weight_sync.mode",
            "tensor",
            "tensor mode hands weights over in shared memory / CUDA IPC, "
            "so the engines must share the trainer's node and devices (cluster.colocate=false)",
            "set cluster.colocate=true, or rollout.weight_sync.mode=distributed (or disk)",
        )
    if ws.mode == "tensor" and c.num_nodes > 1:
        yield Problem(
            "rollout.weight_sync.mode",
            "tensor",
            f"tensor mode hands every bucket from the source rank's node "
            f"to the engines; cluster.num_nodes={c.num_nodes} puts engines on other nodes",
            "set rollout.weight_sync.mode=distributed (or disk), or cluster.num_nodes=1",
        )
    if cfg.debug.check_weight_update_equal and cfg.rollout.engine == "vllm":
        yield Problem(
            "debug.check_weight_update_equal",
            True,
            "the check drives SGLang's /weights_checker (snapshot, reset_tensors, compare, checksum); vLLM 0.32.0's "
            "/weight_checker (checksum, reset, compare against a baseline the caller keeps) is not wired to it",
            "set debug.check_weight_update_equal=false with rollout.engine=vllm",
        )


def check_critic_resources(cfg: RunConfig, derived: Derived) -> Iterator[Problem]:
    c = cfg.cluster.critic
    if cfg.algo.advantage_estimator != "ppo":
        if c.num_gpus_per_node:
            yield Problem(
                "cluster.critic.num_gpus_per_node",
                c.num_gpus_per_node,
                f"only ppo trains a critic; algo.advantage_estimator={cfg.algo.advantage_estimator!r} would leave "
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
        import torch

        return torch.cuda.device_count()
    except Exception:  # torch missing or broken CUDA: treat as no GPU
        return 0
