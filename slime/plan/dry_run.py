"""`debug=dry_run`: resolve the config, print its RunPlan (the training backend and rollout engine, placement,
batch arithmetic, per-GPU memory estimate) and what a real launch still needs, then exit 0 without starting
anything (no Ray, no engine, no run directory).

What a dry run checks: everything validation checks about the config (exit 2 on any problem, as a
real run would). What it does not require: what this machine lacks -- its GPUs, the paths a run reads
(the HF checkpoint, data files, checkpoints to load), prompt data or a reward not given yet. A dry run
plans a launch on the cluster, where those exist; it lists them under "Still needed by a real launch"
(slime.plan.resolve). When the HF checkpoint is here its config.json is still checked against the model.
"""

from __future__ import annotations

from collections.abc import Callable

from slime.config.async_mode import AsyncMode, PauseMode
from slime.config.hooks import load_callable
from slime.config.problems import ConfigError
from slime.config.schema import RunConfig
from slime.models.shape import vision_parameters
from slime.plan.check_spans import spanning_engines
from slime.plan.memory import GIB, gpu_capacity_gib, micro_batch_tokens, parameter_count
from slime.plan.resolve import resolve
from slime.plan.roles import packed_device
from slime.plan.run_plan import RunPlan
from slime.plan.stack import stack_lines
from slime.registry import ENGINES


def _device_unit(cfg: RunConfig) -> str:
    """What one bundle is on this cluster: a GPU, or on CPU a slot that stands for one."""
    return "GPU" if cfg.cluster.device == "cuda" else "CPU slot"


def placement_lines(cfg: RunConfig, plan: RunPlan) -> list[str]:
    """One line per device of the nodes the run uses: which training rank, engine (and critic) it holds."""
    c, d, roles = cfg.cluster, plan.derived, plan.roles
    holds: dict[int, list[str]] = {i: [] for i in range(roles.num_bundles)}
    for rank, bundle in enumerate(roles.actor):
        x = plan.layout.coords(rank)
        holds[bundle].append(f"actor rank {rank} (dp {x.dp_rank}, tp {x.tp_rank}, pp {x.pp_rank}, cp {x.cp_rank})")
    for rank, bundle in enumerate(roles.critic):
        holds[bundle].append(f"critic rank {rank}")
    for engine, bundles in enumerate(roles.engines):
        for part, bundle in enumerate(bundles):
            share = f" [GPU {part + 1}/{len(bundles)}]" if len(bundles) > 1 else ""
            holds[bundle].append(f"engine {engine}{share}")
    unit = _device_unit(cfg)
    per_node = c.num_gpus_per_node
    nodes_used = (d.total_gpus + per_node - 1) // per_node
    lines = [
        f"Placement plan ({d.total_gpus} {unit}(s) of {c.num_nodes} node(s) x {per_node}; "
        f"{'colocated' if c.colocate else 'disaggregated'}; one bundle per {unit}, packed in node and {unit} order):"
    ]
    for index in range(nodes_used * per_node):
        node, gpu = packed_device(index, per_node)
        lines.append(f"  node {node} {unit} {gpu}: {' + '.join(holds.get(index, [])) or 'free'}")
    facts = ENGINES.facts(cfg.rollout.engine)
    lines += _span_lines(cfg, plan, facts.node_span_flags)
    router = facts.router
    if facts.plan_line:
        lines.append(load_callable(facts.plan_line, key="rollout.engine")(cfg, plan.engines))
    lines.append(
        f"  router ({cfg.rollout.router.address or router + ', launched'}) and rollout manager: "
        "the driver's node, no GPU"
    )
    return lines


def _span_lines(cfg: RunConfig, plan: RunPlan, flags: tuple[str, str, str] | None) -> list[str]:
    """A line per engine spanning nodes: its server per node slice and their multi-node flags."""
    lines = []
    for engine, nodes in spanning_engines(plan.roles, cfg.cluster.num_gpus_per_node).items():
        count, rank, address = flags or ("nnodes", "node rank", "rendezvous address")
        first, *rest = sorted(nodes)
        servers = [f"{rank} 0 on node {first} (serves HTTP; {address} on a reserved port there)"]
        servers += [f"{rank} {i} on node {node}" for i, node in enumerate(rest, start=1)]
        lines.append(
            f"  engine {engine} spans {len(nodes)} nodes, one server each: {count} {len(nodes)}; {', '.join(servers)}"
        )
    return lines


def batch_lines(cfg: RunConfig, plan: RunPlan) -> list[str]:
    r, t, derived = cfg.rollout, cfg.train, plan.derived
    k = t.num_steps_per_rollout
    return [
        "Batch arithmetic:",
        f"  rollout step: {r.batch_size} prompts x {r.n_samples_per_prompt} samples = {derived.samples_per_rollout} samples",
        f"  = {k} optimizer step(s) x global batch {derived.global_batch_size} samples"
        f" = {derived.dp_size} data-parallel rank(s) x {derived.samples_per_dp_rank} samples",
        f"  run: {run_length(cfg, plan)}; {_engines_phrase(cfg, plan)}",
        f"  loop: {loop_line(cfg)}",
        *_lora_lines(cfg),
    ]


def _lora_lines(cfg: RunConfig) -> list[str]:
    """What trains with `model.lora`: the adapters' parameters against the model's."""
    m = cfg.model
    if not m.lora.enabled:
        return []
    n, _ = parameter_count(cfg)
    trained = m.lora.parameter_count(m)
    return [
        f"  LoRA rank {m.lora.rank} (alpha {m.lora.alpha:g}) on {', '.join(m.lora.target_modules)}: "
        f"{trained:,} trainable parameters ({100 * trained / n:.2f}% of {n:,}; the base frozen)"
    ]


def run_length(cfg: RunConfig, plan: RunPlan) -> str:
    """The run's length in rollout steps, optimizer steps and samples (train.num_epoch: unknown until the
    prompt data is there)."""
    t, derived = cfg.train, plan.derived
    if t.num_rollout is None:
        return f"{t.num_epoch} epoch(s) of data.prompt_data (its size, and so the step count, is not known here)"
    samples = t.num_rollout * derived.samples_per_rollout
    return f"{t.num_rollout} rollout steps = {derived.num_optimizer_steps} optimizer steps, {samples} samples"


def _engines_phrase(cfg: RunConfig, plan: RunPlan) -> str:
    """'4 engine(s) x 2 GPU(s)'; with server groups (`rollout.models`), one such part per model and engine
    size, in GPU order: '2 engine(s) x 2 GPU(s) (actor), 1 engine(s) x 1 GPU(s) (ref)'."""
    unit = _device_unit(cfg)
    shapes: dict[tuple[str, int], int] = {}
    for spec in plan.engines:
        shapes[spec.model, spec.num_gpus] = shapes.get((spec.model, spec.num_gpus), 0) + 1
    if not shapes:
        return "no engine"
    named = bool(cfg.rollout.models)
    return ", ".join(
        f"{count} engine(s) x {gpus} {unit}(s)" + (f" ({model})" if named else "")
        for (model, gpus), count in shapes.items()
    )


def loop_line(cfg: RunConfig) -> str:
    mode = cfg.train.async_mode
    if mode is AsyncMode.OFF:
        return "synchronous (rollout, then train, then weight sync; samples 0 versions stale)"
    if mode is AsyncMode.FULL:
        r, bound = cfg.rollout, cfg.train.max_staleness
        pause = PauseMode.resolve(r.weight_sync.pause_mode, mode)
        held = "held in place" if pause is PauseMode.IN_PLACE else "aborted and sent again"
        return (
            f"fully async (engines keep up to {r.batch_size} groups in flight, at most {bound + 1} step(s) of groups "
            f"started ahead of the trainer, which takes them in start order; weight sync after every step, running "
            f"requests {held}); groups over {bound} version(s) stale: {r.stale_policy}"
        )
    interval = cfg.rollout.weight_sync.interval
    return (
        f"one-step async (rollout k+1 generated while step k trains), weight sync every {interval} rollout "
        f"step(s); samples up to {interval} version(s) stale"
    )


def memory_lines(cfg: RunConfig, plan: RunPlan) -> list[str]:
    """The estimate's lines (formulas in slime.plan.memory); a CUDA run's plan has one."""
    est = plan.memory
    if est is None:
        return []
    gib, source = gpu_capacity_gib(cfg)
    n, _ = parameter_count(cfg)
    tower = vision_parameters(cfg.model)
    count = f"{n / 1e9:.2f}B parameters" + (f", {tower / 1e9:.2f}B of them the vision tower" if tower else "")
    lines = [f"Memory per GPU (GiB; {count}; GPU {gib:.0f} GiB, {source}):"]
    lines.append("  trainer: " + ", ".join(f"{k} {v / GIB:.2f}" for k, v in est.train.items()))
    lines.append(f"  trainer peak {est.train_peak / GIB:.2f}")
    bound = micro_batch_tokens(cfg, plan.derived)
    lines.append(f"  activations for full micro-batches of {bound.tokens} tokens: {bound.reason}")
    lines.append(
        f"  engine: weights {est.engine['weights'] / GIB:.2f}, KV cache {est.engine['kv_cache'] / GIB:.2f}"
        f" (~{est.kv_tokens} tokens) = {est.engine_total / GIB:.2f}"
    )
    lines.append(f"  fullest GPU{' (colocated)' if est.colocated else ''}: {est.peak / GIB:.2f} of {gib:.0f}")
    return lines


def still_needed_lines(plan: RunPlan) -> list[str]:
    """What this machine lacks and a real launch needs, one line per key (empty when nothing is missing)."""
    if not plan.still_needs:
        return []
    return ["Still needed by a real launch (not on this machine, or not given yet):"] + [
        f"  - {problem}" for problem in plan.still_needs
    ]


def plan_text(cfg: RunConfig, plan: RunPlan) -> str:
    """The printed plan of a resolved config: backend and engine, placement, batch arithmetic, memory, what a
    launch still needs, and the memory estimate's warnings."""
    sections = [
        stack_lines(cfg, plan),
        placement_lines(cfg, plan),
        batch_lines(cfg, plan),
        memory_lines(cfg, plan),
        still_needed_lines(plan),
    ]
    warnings = [f"WARNING: {w}" for w in (plan.memory.warnings() if plan.memory is not None else [])]
    return "\n".join(line for section in [*sections, warnings] for line in section)


def dry_run(cfg: RunConfig, *, out: Callable[[str], None] = print) -> int:
    """Print the plan; 0 when the config is valid, 2 (after printing the problems) when it is not."""
    try:
        resolved, plan = resolve(cfg, defer_absent=True)
    except ConfigError as exc:
        out(f"Configuration error: {exc}")
        return 2
    out(plan_text(resolved, plan))
    out("Dry run: configuration valid; nothing was started.")
    return 0
