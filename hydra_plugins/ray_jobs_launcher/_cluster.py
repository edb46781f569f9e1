"""A Ray cluster owned by one sweep: `ray start --head --block` in a temp dir, token auth, stopped after.

Every process of the cluster carries `CLUSTER_MARK=<its temp dir>` in its environment (inherited from
the `ray start` process), so stopping can find and end whatever the head left behind, and nothing
else: other Ray clusters on the machine (other users, other sweeps) are never touched. The head dies
with the launcher even when the launcher is killed outright (Linux parent-death signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from slime.engine.ports import reserve_ports

log = logging.getLogger(__name__)

CLUSTER_MARK = "SLIME_RAY_JOBS_CLUSTER"
SLOT_RESOURCE = "slime_job_slots"
# Ray's worker processes take ports 10002-19999 by default; the head's own ports stay above them.
FIRST_HEAD_PORT = 20000
# Ray fails a job that waits for its entrypoint resources longer than this (default 15 min); a sweep's
# queued jobs wait for whole runs to finish.
JOB_START_TIMEOUT_S = str(30 * 24 * 3600)


@dataclass(frozen=True, kw_only=True)
class LocalCluster:
    """What a client needs to use the running cluster."""

    address: str  # the dashboard's HTTP address, for JobSubmissionClient
    headers: dict[str, str]  # the bearer token of this cluster (never logged)


def gpu_count() -> int:
    """GPUs this machine offers: CUDA_VISIBLE_DEVICES if set, else `nvidia-smi -L` lines, else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return sum(line.startswith("GPU ") for line in out.splitlines())


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM the child when the launcher exits, however it exits (Linux prctl)."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def local_cluster(
    *, num_cpus: int, num_gpus: int, resources: dict[str, float], start_timeout_s: float, stop_timeout_s: float
) -> Iterator[LocalCluster]:
    """Start a head node for this sweep and stop it (and every process it started) on exit."""
    temp_dir = Path(tempfile.mkdtemp(prefix="slrj", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    lease = reserve_ports("127.0.0.1", 4, first=FIRST_HEAD_PORT)
    gcs, dashboard, client, agent = lease.ports
    token = secrets.token_hex(32)
    env = dict(
        os.environ,
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=token,
        RAY_JOB_START_TIMEOUT_SECONDS=JOB_START_TIMEOUT_S,
        RAY_JOB_STOP_WAIT_TIME_S=str(int(stop_timeout_s)),  # a stopped run's teardown (default 3 s, then SIGKILL)
        RAY_USAGE_STATS_ENABLED="0",
        **{CLUSTER_MARK: str(temp_dir)},
    )
    command = [
        sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
        f"--temp-dir={temp_dir}", f"--port={gcs}", f"--dashboard-port={dashboard}",
        f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
        "--dashboard-host=127.0.0.1", "--include-dashboard=true",
        f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}", f"--resources={_json(resources)}",
    ]  # fmt: skip
    start_log = temp_dir / "ray_start.log"
    log.info("starting a local Ray cluster (%d CPUs, %d GPUs, %s) in %s", num_cpus, num_gpus, resources, temp_dir)
    with start_log.open("w") as out:
        head = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    cluster = LocalCluster(address=f"http://127.0.0.1:{dashboard}", headers={"Authorization": f"Bearer {token}"})
    try:
        _wait_until_up(cluster, head, start_log, start_timeout_s)
        yield cluster
    finally:
        stop(head, temp_dir)
        lease.release()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _json(resources: dict[str, float]) -> str:
    import json

    return json.dumps(resources)


def _wait_until_up(cluster: LocalCluster, head: subprocess.Popen, start_log: Path, timeout_s: float) -> None:
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + timeout_s
    while True:
        if head.poll() is not None:
            raise RuntimeError(f"`ray start --head` exited with {head.returncode}:\n{_tail(start_log)}")
        try:
            JobSubmissionClient(cluster.address, headers=cluster.headers).list_jobs()
            return
        except Exception as exc:  # not listening yet
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the local Ray cluster did not answer at {cluster.address} within {timeout_s}s ({exc}); "
                    f"`ray start` output:\n{_tail(start_log)}"
                ) from exc
            time.sleep(0.5)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def cluster_processes(temp_dir: Path) -> list[psutil.Process]:
    """Live processes carrying this cluster's mark (the head and everything Ray started from it)."""
    found = []
    for proc in psutil.process_iter(["status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(CLUSTER_MARK) == str(temp_dir):
                found.append(proc)
    return found


def stop(head: subprocess.Popen, temp_dir: Path, timeout_s: float = 30.0) -> None:
    """SIGTERM the blocking `ray start` (it stops the processes it started), then end any straggler."""
    if head.poll() is None:
        head.terminate()
        try:
            head.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
    left = cluster_processes(temp_dir)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(left, timeout=5)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    if left:
        log.info("ended %d Ray process(es) the head left behind", len(left))
