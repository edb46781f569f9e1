"""The plan summary a run prints when it starts: what runs where, how long, and where its files go, in at most
MAX_LINES lines. The whole resolved config is `<run dir>/config.yaml` (and `python main.py ... --cfg job` prints the
composed one); `logger.console=verbose` prints it too (slime/driver/console.py)."""

from __future__ import annotations

from pathlib import Path

from slime.config.schema import RunConfig
from slime.plan.dry_run import loop_line, run_length
from slime.plan.run_plan import RunPlan
from slime.plan.stack import engine_line, resources_line, trainer_line
from slime.tracking.wandb_mode import resolve_mode

MAX_LINES = 30


def _data_line(cfg: RunConfig) -> str:
    r = cfg.rollout
    reward = r.rm_type or r.custom_rm_path or "none"
    return f"{cfg.data.prompt_data or cfg.data.source_class or 'none'}; reward {reward}"


def _batch_line(cfg: RunConfig, plan: RunPlan) -> str:
    r, d, k = cfg.rollout, plan.derived, cfg.train.num_steps_per_rollout
    return (
        f"{r.batch_size} prompts x {r.n_samples_per_prompt} samples = {d.samples_per_rollout} samples a step"
        f" = {k} optimizer step{'s' * (k != 1)} x {d.global_batch_size}; lr {cfg.train.lr:g}"
    )


def _checkpoint_line(cfg: RunConfig) -> str:
    c = cfg.checkpoint
    if cfg.debug.rollout_only:
        return "none (debug.rollout_only)"
    every = f"every {c.save_interval} steps and the last" if c.save_interval else "the last step"
    resumed = f"; resumed from {c.load}" if c.load else ""
    return f"{every} -> {c.save}{resumed}"


def _eval_line(cfg: RunConfig) -> str | None:
    e = cfg.eval
    if not e.interval or not e.datasets:
        return None
    return f"every {e.interval} steps: {', '.join(e.datasets)}"


def _tracking_line(cfg: RunConfig) -> str:
    log = cfg.logger
    sinks = ["metrics.jsonl"]
    mode = resolve_mode(log.wandb)
    if mode != "disabled":
        sinks.append(f"wandb {mode} (project {log.wandb.project})")
    if log.tensorboard:
        sinks.append("tensorboard")
    if log.plot:
        sinks.append("plots")
    return ", ".join(sinks)


def plan_summary(cfg: RunConfig, plan: RunPlan, run_dir: Path) -> list[str]:
    """The lines (at most MAX_LINES) printed before a run starts."""
    preset = f" (preset {cfg.preset})" if cfg.preset else ""
    rows = [
        ("trainer", trainer_line(cfg, plan)),
        ("engine", engine_line(cfg, plan)),
        ("resources", resources_line(cfg, plan)),
        ("data", _data_line(cfg)),
        ("batch", _batch_line(cfg, plan)),
        ("length", f"{run_length(cfg, plan)}"),
        ("loop", loop_line(cfg)),
        ("eval", _eval_line(cfg)),
        ("checkpoints", _checkpoint_line(cfg)),
        ("tracking", _tracking_line(cfg)),
        ("run dir", str(run_dir)),
        ("files", "config.yaml (the whole resolved config), main.log (the log), logs/ (router, engines, workers)"),
    ]
    lines = [f"Run: {cfg.algo.name} on {cfg.model.name}{preset}, seed {cfg.seed}"]
    lines += [f"  {name:<12}{value}" for name, value in rows if value is not None]
    return lines[:MAX_LINES]
