"""The Ray Jobs launcher's body: compose each job, start (or join) a cluster, submit, watch, report.

One Ray Job per sweep job: `python main.py <overrides> hydra.run.dir=<sweep dir>/<num>
cluster.ray_address=auto`, whose run joins the job's own cluster. Each job reserves one unit of
`device_resource` per device bundle its config needs; its run's placement group then takes the real
GPUs (or CPU bundles), so the custom resource is what keeps Ray from starting more runs than fit.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from hydra.core.utils import JobReturn, JobRuntime, configure_log, setup_globals

from hydra_plugins.ray_jobs_launcher._cluster import SLOT_RESOURCE, LocalCluster, gpu_count, local_cluster
from hydra_plugins.ray_jobs_launcher._jobs import (
    Job,
    compose_job,
    entrypoint,
    failure_message,
    job_return,
    read_result,
    summary,
)
from slime.config import ConfigError
from slime.config.problems import Problem
from slime.config.validate_addresses import address_problem
from slime.driver.launch import EXIT_CONFIG_ERROR

log = logging.getLogger(__name__)


def launch(launcher, *, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    """Run every job of this batch as a Ray Job; return their JobReturns in input order."""
    params, config = launcher.params, launcher.config
    check_address(params.address)
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    local = params.address is None
    jobs = [
        compose_job(launcher.hydra_context, config, list(overrides), initial_job_idx + i, check=local)
        for i, overrides in enumerate(job_overrides)
    ]
    log.info("Ray Jobs launcher: %d job(s), sweep dir %s", len(jobs), sweep_dir)
    runnable = [job for job in jobs if job.error is None]
    with _signals_as_interrupt(), _cluster(params, runnable) as cluster:
        if cluster is not None:
            _run(params, cluster, runnable, script=Path(inspect.getfile(launcher.task_function)).resolve(), local=local)
    _report(jobs, sweep_dir)
    task_name = JobRuntime.instance().get("name")
    return [job_return(job, task_name) for job in jobs]


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """Ctrl-C and SIGTERM (a scheduler, `kill`) stop the sweep: jobs stopped, then the cluster. SIGINT
    too, because a sweep started as a background job inherits SIGINT ignored."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def check_address(address: str | None) -> None:
    """`hydra.launcher.address` is the dashboard's http(s) URL: a bare host:port makes JobSubmissionClient wait
    ~30 s on a GCS that is not there and say only "Timed out while waiting for GCS". Exit 2 before any job,
    printed as main.py prints a configuration error (no traceback: Hydra prints one for an exception)."""
    what = None if address is None else address_problem("http_url", address)
    if what is not None:
        problem = Problem("hydra.launcher.address", address, what, "give the dashboard's http://head:8265")
        print(f"Configuration error: {ConfigError([problem])}", file=sys.stderr)
        sys.exit(EXIT_CONFIG_ERROR)


@contextlib.contextmanager
def _cluster(params, jobs: list[Job]) -> Iterator[LocalCluster | None]:
    """The cluster at `params.address`, or a local one sized for `jobs` (None when nothing is to run)."""
    if not jobs:
        yield None
        return
    if params.address is not None:
        headers = dict(params.headers)
        token = os.environ.get("RAY_AUTH_TOKEN")
        if token and "authorization" not in {key.lower() for key in headers}:
            headers["Authorization"] = f"Bearer {token}"
        yield LocalCluster(address=params.address, headers=headers)
        return
    gpus = params.local.num_gpus if params.local.num_gpus is not None else gpu_count()
    cpu_jobs = [job.devices for job in jobs if job.device != "cuda"]
    cpus = params.local.num_cpus or max(os.cpu_count() or 1, params.max_concurrent * max(cpu_jobs, default=0))
    capacity = gpus if any(job.device == "cuda" for job in jobs) else cpus
    for job in jobs:
        if job.devices > capacity:
            job.error = f"needs {job.devices} device bundle(s); the local Ray cluster has {capacity}"
    resources = {SLOT_RESOURCE: params.max_concurrent}
    if params.device_resource:
        resources[params.device_resource] = capacity
    with local_cluster(
        num_cpus=cpus,
        num_gpus=gpus,
        resources=resources,
        start_timeout_s=params.local.start_timeout_s,
        stop_timeout_s=params.stop_timeout_s,
    ) as cluster:
        yield cluster


def _run(params, cluster: LocalCluster, jobs: list[Job], *, script: Path, local: bool) -> None:
    """Submit and watch. Locally all jobs go in at once and Ray's slots hold the rest; on a given
    address at most `max_concurrent` are submitted at a time. Ctrl-C stops every submitted job."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.address, headers=cluster.headers)
    queue = [job for job in jobs if job.error is None]
    window = len(queue) if local else params.max_concurrent
    active: list[Job] = []
    try:
        while queue or active:
            while queue and len(active) < window:
                job = queue.pop(0)
                active.append(job)  # before submitting: a Ctrl-C during the submission still stops it
                try:
                    _submit(client, params, job, script=script, local=local)
                except Exception as exc:  # this job only (e.g. a rejected runtime env); the others go on
                    job.error = f"submission failed: {exc}"
                    active.remove(job)
                    log.error("%s", failure_message(job))
            time.sleep(params.poll_interval_s)
            for job in list(active):
                status = str(client.get_job_status(job.submission_id).value)
                if status != job.status:
                    log.info("job %d %s: %s", job.num, job.overrides, status)
                    job.status = status
                if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                    _finish(client, params, job)
                    active.remove(job)
    except KeyboardInterrupt:
        log.warning("interrupted: stopping %d running job(s)", len(active))
        _stop_all(client, params, active, local=local)
        raise


def _submit(client, params, job: Job, *, script: Path, local: bool) -> None:
    # The run's ray.init adds its own worker env vars to the job's runtime env: let them combine.
    runtime_env: dict = {"env_vars": {**params.env_vars, "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}}
    if job.cache_dir is not None:  # the local cluster shares this machine's cache (assets made once above)
        runtime_env["env_vars"]["SLIME_CACHE_DIR"] = job.cache_dir
    if params.ship_project:
        runtime_env["working_dir"] = str(script.parent)
        runtime_env["excludes"] = list(params.excludes)
    resources = {SLOT_RESOURCE: 1} if local else {}
    if params.device_resource and job.devices:
        resources[params.device_resource] = job.devices
    python = params.python or (sys.executable if local else "python")
    job.run_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + params.local.start_timeout_s
    while True:
        try:
            client.submit_job(
                entrypoint=entrypoint(job, python=python, script=script.name if params.ship_project else str(script)),
                submission_id=job.submission_id,
                runtime_env=runtime_env,
                entrypoint_resources=resources or None,
                metadata={"slime_sweep_job": str(job.num)},
            )
            break
        except RuntimeError as exc:  # a fresh head answers before its job agent has registered
            if "No available agent" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    job.status = "SUBMITTED"
    log.info(
        "job %d %s submitted as %s (%d %s bundle(s))",
        job.num,
        job.overrides,
        job.submission_id,
        job.devices,
        job.device,
    )


def _finish(client, params, job: Job) -> None:
    """Keep the job's log in its run dir, read its result.json, and say how it ended."""
    logs = client.get_job_logs(job.submission_id)
    job.log_path.write_text(logs)
    job.log_tail = "\n".join(logs.splitlines()[-params.log_tail_lines :])
    job.exit_code = client.get_job_info(job.submission_id).driver_exit_code
    read_result(job)
    if job.status == "SUCCEEDED":
        log.info("job %d %s succeeded: objective %s; %s", job.num, job.overrides, job.objective, job.run_dir)
    else:
        log.error("%s", failure_message(job))


def _stop_all(client, params, active: list[Job], *, local: bool) -> None:
    """Stop every running job and wait for each to end (at most `stop_timeout_s` in all).

    On the local cluster the run's own process gets SIGTERM, so it tears down as a `kill` would have it
    (result.json: interrupted, exit 143); Ray's stop_job also signals the entrypoint's children (wandb's
    service among them) at once. It is the fallback, and the way on a remote cluster.
    """
    for job in active:
        pid = _driver_pid(client, job) if local else None
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
                continue
        with contextlib.suppress(Exception):
            client.stop_job(job.submission_id)
    deadline = time.monotonic() + params.stop_timeout_s
    for job in active:
        while not _ended(client, job) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not _ended(client, job):
            with contextlib.suppress(Exception):
                client.stop_job(job.submission_id)
        with contextlib.suppress(Exception):
            job.status = str(client.get_job_status(job.submission_id).value)
            _finish(client, params, job)


def _driver_pid(client, job: Job) -> int | None:
    """The run's process id once it has joined the cluster (None before its ray.init)."""
    with contextlib.suppress(Exception):
        info = client.get_job_info(job.submission_id).driver_info
        return int(info.pid) if info is not None and info.pid else None
    return None


def _ended(client, job: Job) -> bool:
    with contextlib.suppress(Exception):
        return client.get_job_status(job.submission_id).is_terminal()
    return False


def _report(jobs: list[Job], sweep_dir: Path) -> None:
    """`ray_jobs.json` in the sweep dir (one record per job of every batch) and a status line per job."""
    path = sweep_dir / "ray_jobs.json"
    records = json.loads(path.read_text()) if path.exists() else []
    records.extend(summary(job) for job in jobs)
    path.write_text(json.dumps(records, indent=2))
    for job in jobs:
        if job.error is not None:
            log.error("%s", failure_message(job))
    done = sum(job.status == "SUCCEEDED" for job in jobs)
    log.info("Ray Jobs launcher: %d of %d job(s) succeeded; summary in %s", done, len(jobs), path)
