"""Start a local Ray cluster (or join `cluster.ray_address`) for one run, and always shut it down."""

from __future__ import annotations

import contextlib
import logging
import os

import ray

from slime.config.schema import ClusterConfig

logger = logging.getLogger(__name__)

# Workers read these at import time, so they travel in the runtime env (REFERENCE.md §10.1).
# Ray starts workers at nice 15 by default; here the workers are the run, and on a shared machine any
# normal-priority process would starve them (a busy 2-core box slowed a run twenty-fold).
WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
              "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1", "RAY_worker_niceness": "0"}


@contextlib.contextmanager
def ray_session(cluster: ClusterConfig, *, num_bundles: int, log_to_driver: bool):
    """A Ray session sized for `num_bundles` device bundles; `ray.shutdown()` on every exit path."""
    runtime_env = {"env_vars": dict(WORKER_ENV)}
    if cluster.ray_address:
        ray.init(address=cluster.ray_address, runtime_env=runtime_env, log_to_driver=log_to_driver)
    else:
        # Logical CPUs may exceed physical cores: each bundle holds one lightly-threaded process.
        num_cpus = max(num_bundles, os.cpu_count() or 1)
        num_gpus = num_bundles if cluster.device == "cuda" else 0
        ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, runtime_env=runtime_env,
                 log_to_driver=log_to_driver, configure_logging=True, logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()
