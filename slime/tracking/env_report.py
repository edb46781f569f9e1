"""The environment report logged once per run (docs/tracking.md#environment-report): versions, GPUs, git, seeds.

Torch-free: package versions come from installed metadata (nothing is imported), the GPU model and
driver from `nvidia-smi` when it exists, the commit from `git`. Written to `<run dir>/env.json` and
logged to the tracker's config under `env`.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from slime.config.schema import RunConfig
from slime.tracking.secrets import redact

PACKAGES = (
    "torch",
    "transformers",
    "megatron-core",
    "sglang",
    "sglang-router",
    "vllm",
    "ray",
    "hydra-core",
    "omegaconf",
    "wandb",
    "tensorboard",
    "slime-hydra",
)


def _run(*cmd: str, cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def gpus() -> list[dict[str, str]]:
    """One entry per visible GPU (name, memory, driver) from nvidia-smi; [] without one."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run("nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader")
    rows = [line.split(", ") for line in (out or "").splitlines() if line.strip()]
    return [dict(zip(("name", "memory", "driver"), row)) for row in rows]


def git_state(root: str | Path) -> dict[str, Any]:
    commit = _run("git", "rev-parse", "HEAD", cwd=str(root))
    status = _run("git", "status", "--porcelain", "--untracked-files=no", cwd=str(root))
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def env_report(cfg: RunConfig) -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "packages": package_versions(),
        "gpus": gpus(),
        "git": git_state(cfg.paths.root_dir),
        "seeds": {"seed": cfg.seed, "data.seed": cfg.data.seed, "model.init_seed": cfg.model.init_seed},
    }


def tracker_config(cfg: RunConfig, choices: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """What the tracker logs as the run's config: the resolved config, Hydra's choices and overrides, and the
    env report, with every secret redacted (slime.tracking.secrets)."""
    config = OmegaConf.to_container(OmegaConf.structured(cfg))
    config["hydra"] = {"choices": dict(choices), "overrides": list(overrides)}
    config["env"] = env_report(cfg)
    return redact(config)
