"""One sweep job: its composed config, the devices it needs, its Ray Job spec and what came back."""

from __future__ import annotations

import copy
import json
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from slime.config import ConfigError, fill_derived, to_run_config
from slime.config.schema import RunConfig
from slime.plan.derive import derive
from slime.plan.validate import validate


class RayJobFailed(RuntimeError):
    """A sweep job that did not succeed, with its status, exit code, log path and log tail."""


@dataclass(kw_only=True)
class Job:
    """One job of a sweep batch. `error` is set when it could not be submitted (its config is invalid)."""

    num: int  # hydra.job.num: its index in the whole sweep
    overrides: list[str]
    config: DictConfig  # the job's composed config, hydra node included
    sweep_dir: Path
    run_dir: Path  # <sweep_dir>/<hydra.sweep.subdir>
    submission_id: str
    device: str = "cpu"
    devices: int = 0  # device bundles its placement group takes: GPUs, or CPU bundles on cluster.device=cpu
    cache_dir: Optional[str] = None
    error: Optional[str] = None
    status: str = "NOT_SUBMITTED"
    exit_code: Optional[int] = None
    log_tail: str = ""
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def log_path(self) -> Path:
        return self.run_dir / "driver.log"

    @property
    def objective(self) -> Optional[float]:
        return (self.result.get("objective") or {}).get("value")


def compose_job(hydra_context, sweep_config: DictConfig, overrides: list[str], num: int, *, check: bool) -> Job:
    """Compose the job's config as Hydra's own launchers do, and size it from the typed config.

    `check`: also run slime's validation here (the cluster is this machine), so an invalid job is
    reported without being submitted; its first-use assets (tiny model, synthetic data) are created
    here once, so concurrent jobs do not race to write them.
    """
    cfg = hydra_context.config_loader.load_sweep_config(sweep_config, list(overrides))
    sweep_dir = Path(str(sweep_config.hydra.sweep.dir)).absolute()
    with open_dict(cfg):
        cfg.hydra.job.num = num
        cfg.hydra.job.id = f"{_safe(sweep_dir.parent.name)}_{_safe(sweep_dir.name)}_{num}_{secrets.token_hex(3)}"
    saved = HydraConfig.instance().cfg
    try:
        HydraConfig.instance().set_config(cfg)
        run_dir = sweep_dir / str(cfg.hydra.sweep.subdir)
        with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
            cfg.hydra.runtime.output_dir = str(run_dir)
        HydraConfig.instance().set_config(cfg)
        job = Job(
            num=num,
            overrides=list(overrides),
            config=cfg,
            sweep_dir=sweep_dir,
            run_dir=run_dir,
            submission_id=cfg.hydra.job.id,
        )
        try:
            _size(job, to_run_config(task_config(cfg)), check=check)
        except (ConfigError, OmegaConfBaseException) as exc:
            job.error = f"configuration error: {exc}"
    finally:
        HydraConfig.instance().cfg = saved
    return job


def _size(job: Job, run_cfg: RunConfig, *, check: bool) -> None:
    derived = validate(run_cfg) if check else derive(run_cfg)
    job.device, job.devices = run_cfg.cluster.device, derived.total_gpus
    if check:
        from slime.assets.prepare import prepare_assets

        prepare_assets(fill_derived(run_cfg, derived))
        job.cache_dir = run_cfg.paths.cache_dir


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)


def task_config(cfg: DictConfig) -> DictConfig:
    task_cfg = copy.deepcopy(cfg)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]
    return task_cfg


def entrypoint(job: Job, *, python: str, script: str) -> str:
    """`python main.py <the job's overrides>` writing to the job's sweep subdir, joining the job's cluster.

    Inside a Ray Job, RAY_ADDRESS names the cluster, and `cluster.ray_address=auto` joins it.
    """
    args = [
        *job.overrides,
        f"hydra.run.dir={job.run_dir}",
        f"hydra.sweep.dir={job.sweep_dir}",  # the sweep it belongs to (e.g. the wandb group)
        f"hydra.job.id={job.submission_id}",
        f"hydra.job.num={job.num}",
        "cluster.ray_address=auto",
    ]
    return " ".join(shlex.quote(part) for part in [python, script, *args])


def read_result(job: Job) -> None:
    """Fill `job.result` from the run's result.json (absent when the job never got past validation)."""
    path = job.run_dir / "result.json"
    if path.exists():
        job.result = json.loads(path.read_text())


def failure_message(job: Job) -> str:
    where = f"log: {job.log_path}" if job.log_path.exists() else "no log"
    if job.error is not None:
        return f"job {job.num} {job.overrides} was not submitted: {job.error}"
    error = job.result.get("error")
    reason = f"exit code {job.exit_code}" + (f": {error.splitlines()[0]}" if error else "")
    return f"job {job.num} {job.overrides} {job.status} ({reason}); {where}; last lines:\n{job.log_tail}"


def job_return(job: Job, task_name: str) -> JobReturn:
    """The JobReturn a sweeper reads: COMPLETED with the run's objective, or FAILED with the reason."""
    ret = JobReturn()
    ret.overrides = job.overrides
    ret.cfg = task_config(job.config)
    ret.hydra_cfg = OmegaConf.create({"hydra": OmegaConf.to_container(job.config.hydra)})
    ret.working_dir = str(job.run_dir)
    ret.task_name = task_name
    if job.status == "SUCCEEDED":
        ret.status, ret.return_value = JobStatus.COMPLETED, job.objective
    else:
        ret.status, ret.return_value = JobStatus.FAILED, RayJobFailed(failure_message(job))
    return ret


def summary(job: Job) -> dict[str, Any]:
    return {
        "num": job.num,
        "overrides": job.overrides,
        "submission_id": job.submission_id,
        "status": job.status if job.error is None else "NOT_SUBMITTED",
        "exit_code": job.exit_code,
        "objective": job.result.get("objective"),
        "error": job.error or job.result.get("error"),
        "run_dir": str(job.run_dir),
        "log": str(job.log_path),
    }
