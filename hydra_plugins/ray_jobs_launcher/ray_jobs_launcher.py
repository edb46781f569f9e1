"""`hydra/launcher=ray_jobs`: run each job of a multirun as a Ray Job (Ray's Job Submission API).

    python main.py --multirun hydra/launcher=ray_jobs algo.eps_clip=0.1,0.2
    python main.py --multirun hydra/launcher=ray_jobs hydra.launcher.address=http://head:8265 ...

Hydra imports this module at start-up to discover plugins, so it holds only the config schema and a
thin class; Ray is imported in `_core.py` when a sweep launches.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from slime.config.input_kinds import HTTP_URL

# Not shipped in a job's working_dir (gitignore syntax, relative to the project root): run outputs,
# caches, checkpoints, environments and VCS data (Ray caps uploads at about 100 MiB).
DEFAULT_EXCLUDES = [
    ".git", ".venv", "outputs/", "multirun/", ".cache/", "wandb/", "checkpoints/", "*.safetensors", "*.pt",
    "__pycache__/", ".pytest_cache/", ".ruff_cache/", "*.egg-info/", "build/", "dist/",
]  # fmt: skip


@dataclass
class LocalClusterConf:
    """The cluster the launcher starts when `address` is null (stopped when the sweep ends)."""

    num_cpus: Optional[int] = None  # logical CPUs; None: max(this machine's, max_concurrent x a CPU job's bundles)
    num_gpus: Optional[int] = None  # None: this machine's GPUs (CUDA_VISIBLE_DEVICES or nvidia-smi)
    start_timeout_s: float = 60.0


@dataclass
class RayJobsLauncherConf:
    _target_: str = "hydra_plugins.ray_jobs_launcher.ray_jobs_launcher.RayJobsLauncher"
    # Ray dashboard address of a running cluster (http://head:8265); null: start a local cluster.
    address: Optional[str] = field(default=None, metadata=HTTP_URL)
    # Jobs running at once. On the local cluster every job is submitted at once and Ray holds the rest
    # (each job takes one of `max_concurrent` slots); on a given address the launcher submits that many.
    max_concurrent: int = 1
    # true: ship the project as the job's working_dir (minus `excludes`); false: the cluster's nodes
    # have the project at this same path (an installed checkout) and jobs run it there.
    ship_project: bool = True
    excludes: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDES))
    # Interpreter of the job entrypoint; null: this one (sys.executable) on the local cluster, else `python`.
    python: Optional[str] = None
    # Custom resource each job reserves, one unit per device bundle its config needs (GPUs, or CPU
    # bundles for cluster.device=cpu). The local cluster declares it; a cluster at `address` must be
    # started with `--resources='{"slime_devices": <GPUs>}'`, or set null to reserve nothing.
    device_resource: Optional[str] = "slime_devices"
    env_vars: dict[str, str] = field(default_factory=dict)  # added to each job's runtime_env
    # HTTP headers for the Job Submission API. Ray's token: RAY_AUTH_TOKEN in the environment becomes
    # `Authorization: Bearer ...`; pass other secrets as ${oc.env:VAR} (saved configs keep the reference).
    headers: dict[str, str] = field(default_factory=dict)
    poll_interval_s: float = 1.0
    log_tail_lines: int = 40  # lines of a failed job's log in its report
    stop_timeout_s: float = 60.0  # Ctrl-C: how long stopped jobs get to tear down
    local: LocalClusterConf = field(default_factory=LocalClusterConf)


ConfigStore.instance().store(group="hydra/launcher", name="ray_jobs", node=RayJobsLauncherConf, provider="slime")


class RayJobsLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        merged = OmegaConf.merge(OmegaConf.structured(RayJobsLauncherConf), params)
        self.params: RayJobsLauncherConf = OmegaConf.to_object(merged)
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.task_function = task_function
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra_plugins.ray_jobs_launcher._core import launch

        return launch(self, job_overrides=job_overrides, initial_job_idx=initial_job_idx)
