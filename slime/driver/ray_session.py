"""Start a local Ray cluster (or join `cluster.ray_address`) for one run, and always shut it down.

With a `worker_output` (the run's console, slime/driver/console.py) Ray prints nothing of its own on the driver's
terminal: the workers' stdout and stderr lines that Ray forwards to the driver (`log_to_driver`) go to that function
instead of Ray's printer, and the records of Ray's logger (its banners, such as the token-authentication warning) go
to the root logger's handlers instead of Ray's own stderr handler.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import ray

# Ray's driver-side fan-out of the worker lines it forwards (ray._private.worker.connect registers its printer,
# "ray_print_logs", there when log_to_driver is on), and the filter its printer applies to the autoscaler's status
# reports; Ray 2.60 has no public hook for either.
from ray._private.ray_logging import global_worker_stdstream_dispatcher as worker_streams
from ray._private.worker import filter_autoscaler_events

from slime.config.schema import ClusterConfig
from slime.driver.interrupts import kill_descendants
from slime.net import unreachable

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


# A batch of forwarded worker lines, as Ray hands it to its printer: {"lines": [str], "pid": ..., "is_err": bool,
# "actor_name" or "task_name": str (may be absent or empty), "ip": str, ...}
WorkerOutput = Callable[[dict[str, Any]], None]
RAY_PRINTER, OUR_PRINTER = "ray_print_logs", "slime_worker_output"


@contextlib.contextmanager
def ray_session(
    cluster: ClusterConfig,
    *,
    num_bundles: int,
    log_to_driver: bool,
    env: dict[str, str] | None = None,
    worker_output: WorkerOutput | None = None,
):
    """A Ray session sized for `num_bundles` device bundles; `ray.shutdown()` on every exit path.

    `env`: more variables for the workers (on top of WORKER_ENV); `worker_output`: where the forwarded worker lines
    go instead of the driver's stdout and stderr (the module docstring)."""
    worker_env = {**WORKER_ENV, **(env or {})}
    with _ray_records_to_root(worker_output is not None):
        if cluster.ray_address:
            check_head_answers(cluster.ray_address)
            ray.init(address=cluster.ray_address, runtime_env={"env_vars": worker_env}, log_to_driver=log_to_driver)
        else:
            # Logical CPUs may exceed physical cores: each bundle holds one lightly-threaded process.
            num_cpus = max(num_bundles, os.cpu_count() or 1)
            num_gpus = num_bundles if cluster.device == "cuda" else 0
            with _environment(worker_env):
                _start_local(num_cpus=num_cpus, num_gpus=num_gpus, log_to_driver=log_to_driver)
        if worker_output is not None and log_to_driver:
            worker_streams.remove_handler(RAY_PRINTER)
            worker_streams.add_handler(OUR_PRINTER, _as_ray_prints(worker_output))
        try:
            yield
        finally:
            ray.shutdown()  # joins Ray's thread that forwards the lines: none comes after it
            worker_streams.remove_handler(OUR_PRINTER)


def _as_ray_prints(worker_output: WorkerOutput) -> WorkerOutput:
    """`worker_output` given what Ray's printer prints: of the autoscaler's lines, its events only (not its status
    report every 5 s)."""

    def forward(batch: dict[str, Any]) -> None:
        if batch.get("pid") == "autoscaler":
            batch = {**batch, "lines": list(filter_autoscaler_events(batch.get("lines", [])))}
        if batch.get("lines"):
            worker_output(batch)

    return forward


@contextlib.contextmanager
def _ray_records_to_root(adopt: bool) -> Iterator[None]:
    """With `adopt`, the records of Ray's logger go to the root logger's handlers while the session lasts: `import
    ray` gave that logger a handler printing to stderr and stopped its propagation (ray._private.log
    .generate_logging_config)."""
    ray_logger = logging.getLogger("ray")
    handlers, propagate = list(ray_logger.handlers), ray_logger.propagate
    if adopt:
        for handler in handlers:
            ray_logger.removeHandler(handler)
        ray_logger.propagate = True
    try:
        yield
    finally:
        if adopt:
            for handler in handlers:
                ray_logger.addHandler(handler)
            ray_logger.propagate = propagate


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
