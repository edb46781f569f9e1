"""The one-screen summary printed at the end of a run, from result.json's dict and metrics.jsonl.

status, rollouts done, wall time
reward: first -> last (best), and the last eval means
time per phase: the sum over rollout steps of each perf/<phase>_time, with its share of the steps' time
training throughput: tokens/s, TFLOP/s per GPU and MFU, and the peak GPU memory of each phase, beside the
                     plan's estimate for a trainer GPU (result.json's `memory_plan_gib`: the dry run's, for full
                     micro-batches, and sized by the fullest micro-batch the run trained); a CPU run
                     (result.json's `device`) says TFLOP/s per trainer worker
outputs: every file of the run directory a user opens (RUN_FILES, logs/, plots), checkpoints, wandb (and the
         `wandb sync` command for an offline run), TensorBoard
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slime.tracking.jsonl import read_jsonl
from slime.tracking.plot import PHASE_TIMES, eval_keys, series


def _reward_lines(records: list[dict[str, Any]]) -> list[str]:
    _, rewards = series(records, "rollout/raw_reward", "rollout/step")
    if not rewards:
        return ["reward      no rollout step finished"]
    lines = [
        f"reward      first {rewards[0]:.4f} -> last {rewards[-1]:.4f} (best {max(rewards):.4f}, {len(rewards)} steps)"
    ]
    names = eval_keys(records)
    last = {k: v for r in records for k, v in r.items() if k in names}
    if last:
        lines.append("eval (last) " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(last.items())[:4]))
    return lines


def _phase_lines(records: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in records if "perf/step_time" in r]
    total = sum(r["perf/step_time"] for r in rows)
    if not rows or total <= 0:
        return []
    lines = [f"time        {total:.1f}s in {len(rows)} rollout steps ({total / len(rows):.2f}s each)"]
    for key in PHASE_TIMES:
        spent = sum(r.get(key, 0.0) for r in rows)
        if spent > 0:
            lines.append(f"  {key[5:-5]:<14} {spent:8.1f}s  {100 * spent / total:5.1f}%")
    return lines


def _throughput_lines(
    records: list[dict[str, Any]], plan: dict[str, float] | None = None, *, device: str = "cuda"
) -> list[str]:
    """Training's real tokens/s, TFLOP/s per GPU (per trainer worker on CPU) and MFU, means over the rollout steps
    after the first (whose time holds compilation and warm-up), each phase's largest peak GPU memory, and the
    engines' largest reports."""
    lines = []
    rows = [r for r in records if "perf/train_tflops" in r][1:] or [r for r in records if "perf/train_tflops" in r]
    if rows:
        mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
        line = f"training    {mean('perf/train_tokens_per_s'):.0f} tokens/s, {mean('perf/train_tflops'):.2f} TFLOP/s"
        line += " per GPU" if device == "cuda" else " per trainer worker"
        line += f", MFU {100 * mean('perf/mfu'):.1f}%" if all("perf/mfu" in r for r in rows) else ""
        lines.append(line + f" (mean of {len(rows)} rollout steps)")
    peaks = _largest(records, "perf/peak_gib/")
    if peaks:
        lines.append("peak GPU    " + ", ".join(f"{k} {v:.1f} GiB" for k, v in sorted(peaks.items())))
    if peaks and plan:
        lines.append(_planned_line(max(peaks.values()), plan))
    engines = _largest(records, "perf/engine_gib/")
    if engines:
        sizes = (f"{k} {v:.2f} GiB" if v >= 0.1 else f"{k} {v * 1024:.1f} MiB" for k, v in sorted(engines.items()))
        lines.append("engines     " + ", ".join(sizes))
    return lines


def _planned_line(measured: float, plan: dict[str, float]) -> str:
    """The trainer GPU's measured peak against the plan: the dry run's figure for full micro-batches and, where the
    run reported its fullest one, the plan for micro-batches of that size, which the ratio is taken against."""
    line = f"  trainer GPU: {measured:.1f} GiB measured, {plan['trainer']:.1f} GiB planned (dry run"
    line += f", micro-batches of {plan['micro_batch_tokens']} tokens)" if "micro_batch_tokens" in plan else ")"
    against = plan["trainer"]
    if "trainer_sized" in plan:
        against = plan["trainer_sized"]
        line += f", {against:.1f} GiB for the fullest trained ({plan['largest_micro_batch_tokens']} tokens)"
    return line + f", measured/planned {measured / against:.2f}"


def _largest(records: list[dict[str, Any]], prefix: str) -> dict[str, float]:
    """{key without `prefix`: its largest value over the records} of every key under `prefix`."""
    keys = {k for r in records for k in r if k.startswith(prefix)}
    return {k[len(prefix) :]: max(r[k] for r in records if k in r) for k in keys}


# The files of a run directory a user opens, with what each holds; listed when the run wrote them.
RUN_FILES = (
    ("main.log", "the log: each phase with its time, warnings"),
    ("config.yaml", "the resolved config"),
    ("metrics.jsonl", "every metric of every step"),
    ("samples.jsonl", "sampled generations with their rewards"),
    ("result.json", "status, final metrics, outputs"),
    ("env.json", "versions, GPUs, git commit, seeds"),
    ("placement.json", "where each trainer rank and engine runs"),
    ("engines.json", "each engine's URL, process and log"),
)


def _output_lines(run_dir: Path, result: dict[str, Any], checkpoint_dir: str | None) -> list[str]:
    outputs = dict(result.get("outputs") or {})
    lines = [f"run dir     {run_dir}"]
    lines += [f"  {name:<15} {what}" for name, what in RUN_FILES if (run_dir / name).exists()]
    logs = sorted(p.name for p in (run_dir / "logs").glob("*.log")) if (run_dir / "logs").is_dir() else []
    if logs:
        lines.append(f"  {'logs/':<15} {', '.join(logs)}")
    plots = [Path(v).name for k, v in outputs.items() if k.startswith("plot:")]
    if plots:
        lines.append(f"  {'plots':<15} {', '.join(plots)}")
    if checkpoint_dir and Path(checkpoint_dir).exists():
        lines.append(f"checkpoints {checkpoint_dir}")
    if "wandb" in outputs:
        lines.append(f"wandb       {outputs['wandb']}")
    if "wandb_sync" in outputs:
        lines.append(f"  upload:   {outputs['wandb_sync']}")
    if "tensorboard" in outputs:
        lines.append(f"tensorboard {outputs['tensorboard']}")
    return lines


def render_summary(result: dict[str, Any], *, checkpoint_dir: str | None = None) -> str:
    run_dir = Path(result["run_dir"])
    metrics = run_dir / "metrics.jsonl"
    records = read_jsonl(metrics, tolerant=True) if metrics.exists() else []
    head = (
        f"Run {result['status']}"
        + (f" in phase {result['phase']}" if result["status"] != "completed" else "")
        + f": {result['rollouts_completed']} rollout steps"
        + f" ({result['start_rollout']} -> {result['start_rollout'] + result['rollouts_completed']} of {result['num_rollout']})"
        + f" in {result['elapsed_s']:.1f}s"
    )
    plan = result.get("memory_plan_gib")
    body = (
        _reward_lines(records)
        + _phase_lines(records)
        + _throughput_lines(records, plan, device=result.get("device", "cuda"))
    )
    body += _output_lines(run_dir, result, checkpoint_dir)
    rule = "=" * 78
    return "\n".join([rule, head, *body, rule])
