"""`debug=dry_run`: compose, validate, print the placement plan, the batch arithmetic and a per-GPU
memory estimate, then exit 0 without starting anything (no Ray, no engine, no run directory).

What a dry run checks: everything validation checks about the config (exit 2 on any problem, as a
real run would). What it does not require: this machine's GPUs and the paths a run reads (the HF
checkpoint, data files, checkpoints to load). A dry run plans a launch on the cluster, where those
exist; problems of that kind (`Problem.machine`) are printed as warnings. When the HF checkpoint is
here its config.json is still checked against the model config.
"""

from __future__ import annotations

from collections.abc import Callable

from slime.algo.estimators import ESTIMATORS
from slime.config.derived import Derived
from slime.config.problems import ConfigError
from slime.config.schema import RunConfig
from slime.engine.groups import EngineSpec, engine_specs
from slime.plan.derive import derive
from slime.plan.validate import collect_problems
from slime.runtime.plan import assign_roles, packed_device
from slime.tracking.memory import GIB, estimate_memory, gpu_capacity_gib, parameter_count
from slime.train.layout import RankLayout


def _device_unit(cfg: RunConfig) -> str:
    """What one bundle is on this cluster: a GPU, or on CPU a slot that stands for one."""
    return "GPU" if cfg.cluster.device == "cuda" else "CPU slot"


def placement_lines(cfg: RunConfig, derived: Derived) -> list[str]:
    """One line per device of the nodes the run uses: which training rank, engine (and critic) it holds."""
    c, p = cfg.cluster, cfg.parallelism
    estimator = ESTIMATORS.find(cfg.algo.advantage_estimator)  # None: unknown, reported by validation
    with_critic = estimator is not None and estimator.needs_critic
    with_actor = with_critic and c.critic.colocate_with_actor
    specs = engine_specs(cfg, derived.rollout_gpus)
    engine_gpus = [spec.num_gpus for spec in specs]
    plan = assign_roles(derived, colocate=c.colocate, engine_gpus=engine_gpus, critic_with_actor=with_actor)
    layout = RankLayout.for_world(derived.actor_gpus, tp=p.tp, cp=p.cp, pp=p.pp, ep=p.ep, etp=p.etp)
    holds: dict[int, list[str]] = {i: [] for i in range(derived.total_gpus)}
    for rank, bundle in enumerate(plan.actor):
        x = layout.coords(rank)
        holds[bundle].append(f"actor rank {rank} (dp {x.dp_rank}, tp {x.tp_rank}, pp {x.pp_rank}, cp {x.cp_rank})")
    if with_critic:
        for rank, bundle in enumerate(plan.critic):
            holds[bundle].append(f"critic rank {rank}")
    for engine, bundles in enumerate(plan.engines):
        for part, bundle in enumerate(bundles):
            share = f" [GPU {part + 1}/{len(bundles)}]" if len(bundles) > 1 else ""
            holds[bundle].append(f"engine {engine}{share}")
    unit = _device_unit(cfg)
    per_node = c.num_gpus_per_node
    nodes_used = (derived.total_gpus + per_node - 1) // per_node
    lines = [
        f"Placement plan ({derived.total_gpus} {unit}(s) of {c.num_nodes} node(s) x {per_node}; "
        f"{'colocated' if c.colocate else 'disaggregated'}; one bundle per {unit}, packed in node and {unit} order):"
    ]
    for index in range(nodes_used * per_node):
        node, gpu = packed_device(index, per_node)
        lines.append(f"  node {node} {unit} {gpu}: {' + '.join(holds.get(index, [])) or 'free'}")
    router = "vllm-router" if cfg.rollout.engine == "vllm" else "sglang-router"
    if cfg.rollout.engine == "vllm":
        lines.append(vllm_line(cfg, specs))
    lines.append(
        f"  router ({cfg.rollout.router.address or router + ', launched'}) and rollout manager: "
        "the driver's node, no GPU"
    )
    return lines


def vllm_line(cfg: RunConfig, specs: list[EngineSpec]) -> str:
    """How the vLLM servers split their GPUs: rollout.vllm with each server group's overrides on top."""
    from slime.engine.vllm.engine_args import PARALLEL_SIZES, tensor_parallel_size

    short = {"pipeline_parallel_size": "pp", "prefill_context_parallel_size": "pcp", "data_parallel_size": "dp"}
    unit = _device_unit(cfg)
    shapes: dict[str, int] = {}  # "each 2 GPU(s) = tp 2" -> servers of that shape, in GPU order
    for spec in specs:
        args = {**cfg.rollout.vllm, **spec.overrides}
        sizes = [f"tp {tensor_parallel_size(spec.num_gpus, args)}"]
        sizes += [f"{short[name]} {args[name]}" for name in PARALLEL_SIZES if (args.get(name) or 1) > 1]
        shape = f"each {spec.num_gpus} {unit}(s) = {' x '.join(sizes)}"
        shapes[shape] = shapes.get(shape, 0) + 1
    described = "; ".join(f"{count}, {shape}" for shape, count in shapes.items())
    return f"  vLLM servers: {described} (python -m {cfg.rollout.vllm_launch.module})"


def batch_lines(cfg: RunConfig, derived: Derived) -> list[str]:
    r, t = cfg.rollout, cfg.train
    k = t.num_steps_per_rollout
    return [
        "Batch arithmetic:",
        f"  rollout step: {r.batch_size} prompts x {r.n_samples_per_prompt} samples = {derived.samples_per_rollout} samples",
        f"  = {k} optimizer step(s) x global batch {derived.global_batch_size} samples"
        f" = {derived.dp_size} data-parallel rank(s) x {derived.samples_per_dp_rank} samples",
        f"  run: {t.num_rollout} rollout steps = {derived.num_optimizer_steps} optimizer steps, "
        f"{t.num_rollout * derived.samples_per_rollout} samples; {_engines_phrase(cfg, derived)}",
        f"  loop: {_loop_line(cfg)}",
    ]


def _engines_phrase(cfg: RunConfig, derived: Derived) -> str:
    """'4 engine(s) x 2 GPU(s)'; with server groups (`rollout.models`), one such part per model and engine
    size, in GPU order: '2 engine(s) x 2 GPU(s) (actor), 1 engine(s) x 1 GPU(s) (ref)'."""
    unit = _device_unit(cfg)
    shapes: dict[tuple[str, int], int] = {}
    for spec in engine_specs(cfg, derived.rollout_gpus):
        shapes[spec.model, spec.num_gpus] = shapes.get((spec.model, spec.num_gpus), 0) + 1
    if not shapes:
        return "no engine"
    named = bool(cfg.rollout.models)
    return ", ".join(
        f"{count} engine(s) x {gpus} {unit}(s)" + (f" ({model})" if named else "")
        for (model, gpus), count in shapes.items()
    )


def _loop_line(cfg: RunConfig) -> str:
    if not cfg.train.is_async:
        return "synchronous (rollout, then train, then weight sync; samples 0 versions stale)"
    interval = cfg.rollout.weight_sync.interval
    return (
        f"one-step async (rollout k+1 generated while step k trains), weight sync every {interval} rollout "
        f"step(s); samples up to {interval} version(s) stale"
    )


def memory_lines(cfg: RunConfig, derived: Derived) -> tuple[list[str], list[str]]:
    """(the estimate's lines, its warnings); formulas in slime.tracking.memory."""
    est = estimate_memory(cfg, derived)
    gib, source = gpu_capacity_gib(cfg)
    n, _ = parameter_count(cfg)
    lines = [f"Memory per GPU (GiB; {n / 1e9:.2f}B parameters; GPU {gib:.0f} GiB, {source}):"]
    lines.append("  trainer: " + ", ".join(f"{k} {v / GIB:.2f}" for k, v in est.train.items()))
    lines.append(f"  trainer peak {est.train_peak / GIB:.2f}")
    lines.append(
        f"  engine: weights {est.engine['weights'] / GIB:.2f}, KV cache {est.engine['kv_cache'] / GIB:.2f}"
        f" (~{est.kv_tokens} tokens) = {est.engine_total / GIB:.2f}"
    )
    lines.append(f"  fullest GPU{' (colocated)' if est.colocated else ''}: {est.peak / GIB:.2f} of {gib:.0f}")
    return lines, est.warnings()


def dry_run(cfg: RunConfig, *, out: Callable[[str], None] = print) -> int:
    """Print the plan; 0 when the config is valid, 2 (after printing the problems) when it is not."""
    problems = collect_problems(cfg)
    config_problems = [p for p in problems if not p.machine]
    if config_problems:
        out(f"Configuration error: {ConfigError(config_problems)}")
        return 2
    derived = derive(cfg)
    warnings = [f"not checked on this machine: {p}" for p in problems if p.machine]
    sections = [placement_lines(cfg, derived), batch_lines(cfg, derived)]
    if cfg.cluster.device == "cuda":
        lines, memory_warnings = memory_lines(cfg, derived)
        sections.append(lines)
        warnings += memory_warnings
    for section in sections:
        out("\n".join(section))
    for warning in warnings:
        out(f"WARNING: {warning}")
    out("Dry run: configuration valid; nothing was started.")
    return 0
