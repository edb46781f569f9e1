"""Start a local Ray cluster (or join `cluster.ray_address`) for one run, and always shut it down."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from urllib.parse import urlsplit

import ray

from slime.config.schema import ClusterConfig
from slime.net import unreachable
from slime.runtime.interrupts import kill_descendants

logger = logging.getLogger(__name__)
HEAD_CONNECT_TIMEOUT_S = 10.0  # a live head's GCS accepts at once; a firewall that drops packets takes this long

# Workers read these at import time, before any config reaches them. A local cluster's raylet and so every worker
# inherit them from the driver's environment at `ray.init`; a joined cluster gets them as the job's
# runtime env, which costs each worker a round trip to the runtime-env agent and keeps Ray's
# pre-started workers unused (about 1 CPU-second per worker on a 2-core box).
# Ray starts workers at nice 15 by default; here the workers are the run, and on a shared machine any
# normal-priority process would starve them (a busy 2-core box slowed a run twenty-fold).
WORKER_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_DEDUP_LOGS": "0",
    "PYTHONUNBUFFERED": "1",
    "RAY_worker_niceness": "0",
}


@contextlib.contextmanager
def ray_session(cluster: ClusterConfig, *, num_bundles: int, log_to_driver: bool, env: dict[str, str] | None = None):
    """A Ray session sized for `num_bundles` device bundles; `ray.shutdown()` on every exit path.

    `env`: more variables for the workers (on top of WORKER_ENV)."""
    worker_env = {**WORKER_ENV, **(env or {})}
    if cluster.ray_address:
        check_head_answers(cluster.ray_address)
        ray.init(address=cluster.ray_address, runtime_env={"env_vars": worker_env}, log_to_driver=log_to_driver)
    else:
        # Logical CPUs may exceed physical cores: each bundle holds one lightly-threaded process.
        num_cpus = max(num_bundles, os.cpu_count() or 1)
        num_gpus = num_bundles if cluster.device == "cuda" else 0
        with _environment(worker_env):
            _start_local(num_cpus=num_cpus, num_gpus=num_gpus, log_to_driver=log_to_driver)
    try:
        yield
    finally:
        ray.shutdown()


def check_head_answers(address: str, timeout_s: float = HEAD_CONNECT_TIMEOUT_S) -> None:
    """`ray.init(address=...)` retries a head that is not there for minutes, printing only GCS timeouts: a
    host:port (or ray://host:port) that accepts no TCP connection within `timeout_s` stops the run at once,
    naming the key. `auto` and `local` are Ray's to resolve."""
    if address in ("auto", "local"):
        return
    parts = urlsplit(address if "://" in address else f"//{address}")
    why = unreachable(parts.hostname or "", parts.port or 0, timeout_s)
    if why is not None:
        raise RuntimeError(
            f"cluster.ray_address={address}: no Ray head answers at {parts.hostname}:{parts.port} ({why}); start "
            f"the cluster there (ray start --head --port={parts.port}), or set cluster.ray_address=null to start "
            "one on this machine"
        )


def _start_local(*, num_cpus: int, num_gpus: int, log_to_driver: bool, attempts: int = 2) -> None:
    """`ray.init` of a local cluster. Ray gives a new raylet a fixed 30 s to register with its GCS; on a
    saturated machine that start fails, so it is retried once after its half-started daemons are killed
    (nothing else runs below the driver yet)."""
    for attempt in range(1, attempts + 1):
        try:
            ray.init(
                address="local",  # never a `ray start` cluster this machine happens to run (Ray's default joins it)
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                include_dashboard=False,
                log_to_driver=log_to_driver,
                configure_logging=True,
                logging_level=logging.WARNING,
            )
            return
        except Exception as error:  # Ray raises a bare Exception for this one
            if "timed out during startup" not in str(error) or attempt == attempts:
                raise
            logger.warning("Ray's local node did not start in time (%s); starting it again", error)
            ray.shutdown()
            kill_descendants()


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """`values` set in os.environ inside the block (for the processes started there), restored after."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
