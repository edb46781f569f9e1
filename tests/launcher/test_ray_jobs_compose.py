"""The Ray Jobs launcher's job side without Ray: each job composed as Hydra's launchers do, sized from its
typed config (the devices it reserves), its entrypoint, and the JobReturn a sweeper reads."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hydra import initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import JobStatus
from hydra.types import HydraContext, RunMode

from hydra_plugins.ray_jobs_launcher._cluster import gpu_count
from hydra_plugins.ray_jobs_launcher._jobs import RayJobFailed, compose_job, entrypoint, job_return
from slime.run_schema import register_configs
from tests.helpers.compose import CONF


@pytest.fixture
def sweep(tmp_path):
    """(hydra context, the multirun's config) as Hydra hands them to a launcher."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        config = loader.load_configuration(
            "config", overrides=["hydra/launcher=ray_jobs", f"hydra.sweep.dir={tmp_path}"], run_mode=RunMode.MULTIRUN
        )
        yield HydraContext(config_loader=loader, callbacks=Callbacks()), config
    GlobalHydra.instance().clear()


def test_a_job_reserves_the_devices_its_composed_config_needs(sweep, tmp_path):
    context, config = sweep
    cpu = compose_job(context, config, ["algo=ppo"], 0, check=False)
    assert (cpu.device, cpu.devices, cpu.error) == ("cpu", 3, None)  # actor + critic + engine bundles
    gpu = compose_job(context, config, ["model=qwen3_4b", "cluster.colocate=true"], 5, check=False)
    assert (gpu.device, gpu.devices, gpu.error) == ("cuda", 4, None)  # 4 actor GPUs, engines on them
    assert gpu.run_dir == tmp_path / "5" and gpu.submission_id.startswith(f"{tmp_path.parent.name}_{tmp_path.name}_5_")
    # unique per submission: a rerun of the sweep into the same directory is a new Ray Job
    assert gpu.submission_id != compose_job(context, config, ["model=qwen3_4b"], 5, check=False).submission_id


def test_an_invalid_job_is_reported_without_being_submitted(sweep):
    context, config = sweep
    job = compose_job(context, config, ["train.global_batch_size=100"], 1, check=True)
    assert job.error is not None and "train.global_batch_size=100" in job.error
    ret = job_return(job, "main")
    assert ret.status == JobStatus.FAILED
    with pytest.raises(RayJobFailed, match="job 1 .* was not submitted: configuration error"):
        _ = ret.return_value


def test_entrypoint_runs_the_job_overrides_in_its_sweep_subdir_on_the_jobs_cluster(sweep, tmp_path):
    context, config = sweep
    job = compose_job(context, config, ["data.prompt_data=/a b/c.jsonl", "algo.eps_clip=0.1"], 2, check=False)
    argv = shlex.split(entrypoint(job, python="/venv/bin/python", script="main.py"))
    assert argv[:4] == ["/venv/bin/python", "main.py", "data.prompt_data=/a b/c.jsonl", "algo.eps_clip=0.1"]
    assert f"hydra.run.dir={tmp_path / '2'}" in argv and "cluster.ray_address=auto" in argv


def test_a_succeeded_job_returns_its_objective(sweep, tmp_path):
    context, config = sweep
    job = compose_job(context, config, [], 0, check=False)
    job.status, job.result = "SUCCEEDED", {"objective": {"name": "rollout/raw_reward", "value": 0.5}}
    ret = job_return(job, "main")
    assert (ret.status, ret.return_value, ret.working_dir) == (JobStatus.COMPLETED, 0.5, str(tmp_path / "0"))
    assert ret.overrides == [] and "hydra" not in ret.cfg and Path(ret.hydra_cfg.hydra.sweep.dir) == tmp_path


def test_gpu_count_honours_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    assert gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_count() == 0
