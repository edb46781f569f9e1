"""From Hydra's DictConfig to a finished run: typed config, validation, assets, run, result.json.

What the terminal shows meanwhile, and the rule for stdout and stderr: slime/driver/console.py.

Exit status (run mode): 0 completed; 2 configuration error (raised before anything started);
3 failure during the run; 130 interrupted by SIGINT (Ctrl-C), 143 by SIGTERM. result.json is written
at the end of every run that got past validation, failed or interrupted ones included, and names the
phase that failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from slime.config import ConfigError, to_run_config
from slime.config.objective import objective_name, objective_value
from slime.driver.console import RunConsole
from slime.driver.fault_injection import FaultInjector
from slime.driver.interrupts import Interrupts, exit_now
from slime.driver.run_state import RunState
from slime.driver.watchdog import PhaseLimits, Watchdog, remove_armed
from slime.plan.dry_run import dry_run
from slime.plan.memory import memory_plan_gib
from slime.plan.plan_summary import plan_summary
from slime.plan.resolve import resolve
from slime.plan.stack import count
from slime.rollout.manager.deaths import failure_text
from slime.tracking.env_report import tracker_config
from slime.tracking.jsonl import read_jsonl
from slime.tracking.naming import HydraRun, run_identity
from slime.tracking.secrets import redact, redact_overrides, scrub, secret_env_values
from slime.tracking.summary import render_summary

EXIT_OK, EXIT_CONFIG_ERROR, EXIT_RUN_FAILED = 0, 2, 3
logger = logging.getLogger("slime")


def _hydra_run():
    """Hydra's runtime facts the tracker names the run by (slime.tracking.naming)."""
    hydra_cfg = HydraConfig.get()
    sweep_dir = hydra_cfg.sweep.dir if hydra_cfg.mode == RunMode.MULTIRUN else None
    # A job a launcher runs as its own process (a Ray Job) is a single run inside the sweep's directory, which
    # the sweeper marked with multirun.yaml.
    parent = Path(hydra_cfg.runtime.output_dir).parent
    if sweep_dir is None and (parent / "multirun.yaml").exists():
        sweep_dir = str(parent)
    return HydraRun(
        overrides=list(hydra_cfg.overrides.task),
        choices={k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra")},
        sweep_dir=sweep_dir,
    )


def execute(dcfg: DictConfig) -> float | None:
    """Run one job and return its objective (`logger.objective`, see slime/config/objective.py), which a
    sweeper optimises. In multirun mode errors propagate to the launcher instead of exiting."""
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    scrub_hydra_records(Path(HydraConfig.get().runtime.output_dir), list(HydraConfig.get().overrides.task))
    try:
        cfg = to_run_config(dcfg)
        if cfg.debug.dry_run:  # plan only: nothing is started, no run directory is made
            return _dry_run(cfg, multirun=multirun)
        cfg, plan = resolve(cfg)  # read-only from here on
    except (ConfigError, OmegaConfBaseException) as exc:
        if multirun:
            raise
        print(f"Configuration error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)
    logging.getLogger().setLevel(cfg.debug.log_level)
    run_dir = Path(cfg.paths.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    text = redacted_yaml(cfg)
    (run_dir / "config.yaml").write_text(text)
    console = RunConsole(cfg.logger, total=cfg.train.num_rollout, steps_per_rollout=cfg.train.num_steps_per_rollout)
    try:
        console.open(run_dir)
        if console.verbose:
            console.report(f"Resolved config (saved to {run_dir / 'config.yaml'}):\n{text}")
            console.report("Derived values:\n" + "\n".join(f"  {k:<26} {v}" for k, v in plan.table()))
        console.report("\n".join(plan_summary(cfg, plan, run_dir)))
        result, code, interrupted = _run_with_result(cfg, plan, run_dir, console)
    finally:
        console.close()
    if multirun:
        if interrupted is not None:  # Ctrl-C stops the whole sweep, not just this job
            raise interrupted
        if code != EXIT_OK:
            raise RuntimeError(f"run {result['status']} in phase {result['phase']}: {result['error']}")
    else:
        exit_now(code)
    return result["objective"]["value"]


def redacted_yaml(cfg) -> str:
    """The resolved config as YAML with secrets redacted (slime.tracking.secrets): credentials come from the
    environment, never from a file a run leaves behind."""
    return OmegaConf.to_yaml(OmegaConf.create(redact(OmegaConf.to_container(OmegaConf.structured(cfg)))))


def scrub_hydra_records(output_dir: Path, overrides: list[str]) -> None:
    """Hydra wrote the job's overrides and config to `<output_dir>/.hydra` before the run began: the values of
    secret-named overrides and of secret environment variables are replaced there too."""
    secrets = secret_env_values()
    secrets += [o.partition("=")[2] for o, r in zip(overrides, redact_overrides(overrides, [])) if o != r]
    secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
    for record in (output_dir / ".hydra").glob("*.yaml") if secrets else ():
        text = record.read_text()
        if any(secret in text for secret in secrets):
            record.write_text(scrub(text, secrets))


def _dry_run(cfg, *, multirun: bool) -> None:
    """debug=dry_run (slime.plan.dry_run): exit 0, or 2 on a configuration problem (a sweep job raises)."""
    code = dry_run(cfg)
    if multirun:
        if code:
            raise RuntimeError("dry run: invalid configuration (printed above)")
        return None
    sys.exit(code)


def _largest_micro_batch(metrics: Path) -> tuple[int | None, bool | None]:
    """The most tokens a trainer's micro-batch held over the run (`perf/micro_batch_tokens`) and whether an optimizer
    step took several (`perf/micro_batches_per_step`); None before any."""
    records = read_jsonl(metrics, tolerant=True) if metrics.exists() else []
    sizes = [r["perf/micro_batch_tokens"] for r in records if "perf/micro_batch_tokens" in r]
    counts = [r["perf/micro_batches_per_step"] for r in records if "perf/micro_batches_per_step" in r]
    return (int(max(sizes)) if sizes else None), (max(counts) > 1 if counts else None)


@dataclasses.dataclass(kw_only=True)
class _ResultFile:
    """<run dir>/result.json and the closing summary, written once the run ends (or is forced to)."""

    cfg: Any
    state: RunState
    run_dir: Path
    console: RunConsole
    started: float  # time.time() at the run's start
    plan: Any = None  # the RunPlan: a CUDA run's memory estimate is shown beside the measured peaks

    def write(self, status: str, error: str | None) -> dict:
        cfg, state = self.cfg, self.state
        objective = objective_name(cfg)
        result = {
            "status": status,
            "phase": state.phase if status != "completed" else "done",
            "error": error,
            "start_rollout": state.start_rollout,
            "rollouts_completed": state.rollouts_completed,
            "num_rollout": cfg.train.num_rollout,
            "elapsed_s": round(time.time() - self.started, 2),
            "final_metrics": state.last_metrics,
            "objective": {"name": objective, "value": objective_value(objective, state.last_metrics, state.last_eval)},
            "reward_curve": state.reward_curve,
            "outputs": state.outputs,
            "run_dir": str(self.run_dir),
            "device": cfg.cluster.device,
        }
        if self.plan is not None and self.plan.memory is not None:
            largest, several = _largest_micro_batch(self.run_dir / "metrics.jsonl")
            result["memory_plan_gib"] = memory_plan_gib(cfg, self.plan.derived, largest, several=several)
        (self.run_dir / "result.json").write_text(json.dumps(result, indent=2, default=str))
        try:
            summary = render_summary(result, checkpoint_dir=cfg.checkpoint.save)
        except Exception as exc:  # the summary is a convenience; result.json is written
            summary = f"Run {status} in {result['elapsed_s']:.1f}s; results in {self.run_dir} (no summary: {exc})"
        self.console.finish(
            summary, outcome="done" if status == "completed" else f"{status} in phase {result['phase']}"
        )
        return result

    def forced(self, signum: int) -> None:
        """A second signal during teardown: the result still says what happened."""
        if self.state.hung is not None:
            self.write("hung", f"{self.state.hung} (forced exit)")
        else:
            self.write("interrupted", f"{signal.Signals(signum).name} during teardown (forced exit)")


def _run_with_result(cfg, plan, run_dir: Path, console: RunConsole):
    """Run under the signal policy and write result.json whatever happens (a forced exit included).

    Returns (the result.json dict, the exit code, the RunInterrupted if a signal stopped the run).
    """
    # Ray (~1.7 s of imports) only once the config is known to be good: a configuration error, --cfg job and
    # a dry run answer without it.
    from slime.driver.driver import RunJob, run

    state = RunState()
    console.follow(state.events)
    FaultInjector.attach(cfg.debug, state.events, run_dir)  # only when a debug option asks for a fault
    hydra = _hydra_run()
    result_file = _ResultFile(cfg=cfg, state=state, run_dir=run_dir, console=console, started=time.time(), plan=plan)
    status, error, code, interrupted = "completed", None, EXIT_OK, None
    with Interrupts(on_force=result_file.forced) as interrupts, _watchdog(cfg, state, interrupts, run_dir):
        try:
            job = RunJob(
                cfg=cfg,
                plan=plan,
                config_dict=tracker_config(cfg, hydra.choices, hydra.overrides),
                identity=run_identity(cfg, hydra, summary=_one_line(cfg, plan.derived)),
                console=console,
            )
            run(job, state, interrupts)
        except ConfigError as exc:  # found once the assets were made (slime.driver.preflight): nothing started
            status, error, code = "invalid_config", str(exc), EXIT_CONFIG_ERROR
            console.problem(f"Configuration error: {exc}")
        except KeyboardInterrupt as exc:  # ours, or the plain one ray.get raises when a signal cuts its wait
            interrupted = interrupts.interrupted(exc)
            status, error, code = "interrupted", str(interrupted), interrupted.exit_code
            if state.hung is not None:  # the watchdog stopped the run: a failure, not the user's interrupt
                status, error, code, interrupted = "hung", state.hung, EXIT_RUN_FAILED, None
        except Exception as exc:  # the run failed: record where, then exit non-zero
            status, error, code = "failed", failure_text(exc), EXIT_RUN_FAILED
            console.problem(traceback.format_exc().rstrip())
        interrupts.begin_teardown()  # a signal while the result is written forces, and still writes it
        result = result_file.write(status, error)
    return result, code, interrupted


def _one_line(cfg, derived) -> str:
    """The run in one line (the tracker's notes); on CPU in workers, not GPUs."""
    where = cfg.cluster.device.upper() + (", colocated" if cfg.cluster.colocate else "")
    return (
        f"{cfg.algo.name} on {cfg.model.name}: trainer {count(derived.actor_gpus, cfg)}, engines "
        f"{count(derived.rollout_gpus, cfg)} ({where}), "
        f"{cfg.rollout.batch_size} prompts x {cfg.rollout.n_samples_per_prompt} samples per step, "
        f"{cfg.train.num_rollout} steps, seed {cfg.seed}"
    )


@contextlib.contextmanager
def _watchdog(cfg, state, interrupts: Interrupts, run_dir: Path):
    """`runtime.phase_timeout_s` (startup: `runtime.startup_timeout_s`): a phase overrunning it dumps the stacks and
    stops the run (status "hung")."""
    limits = PhaseLimits.of_config(cfg.runtime)
    if not limits.armed:
        yield
        return

    def fire(message: str) -> None:
        state.hung = message
        interrupts.interrupt(f"watchdog: {message}")

    stacks_dir = run_dir / "stacks"
    watchdog = Watchdog(
        state.events,
        limits,
        stacks_dir,
        on_fire=fire,
        on_stuck=lambda: interrupts.force(EXIT_RUN_FAILED),
    ).start()
    try:
        yield
    finally:
        watchdog.stop()
        remove_armed(stacks_dir)
