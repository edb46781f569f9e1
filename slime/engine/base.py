"""`HTTPEngine`: what every engine backend shares (launch, readiness, SGLang control calls, shutdown).

A backend subclasses it and implements `_launch(port_file) -> subprocess.Popen` (use
`slime.engine.process.launch_process`). The child must bind its own port and write it to
`port_file`; `start()` then polls GET /health_generate until it answers 200. This is a plain class
(no Ray import): the rollout manager wraps it in an actor, the GPU tier drives it directly.

Also the engine registry: `ENGINES` maps `rollout.engine` names to classes; `get_engine_class(name)`.
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from slime.engine import http_client
from slime.engine.http_client import EngineHTTPError
from slime.engine.process import http_url, log_tail, terminate_process

logger = logging.getLogger(__name__)


class EngineStartupError(RuntimeError):
    """The server exited or did not become healthy in time; the message carries its log tail."""


class HTTPEngine:
    """One inference server process spoken to over SGLang's HTTP API.

    Args:
        rank: engine index (names the log file `<log_dir>/engine_<rank>.log`).
        host: address the server binds to and is reached at.
        log_dir: directory for the server's stdout/stderr log.
        startup_timeout_s: seconds from launch until /health_generate must answer 200.
        request_timeout_s: default timeout (seconds) of control calls.
        shutdown_grace_s: seconds between SIGTERM and SIGKILL in `shutdown()`.
    """

    name = "base"

    def __init__(
        self,
        *,
        rank: int,
        host: str,
        log_dir: str,
        startup_timeout_s: float = 120.0,
        request_timeout_s: float = 60.0,
        shutdown_grace_s: float = 10.0,
    ):
        self.rank = int(rank)
        self.host = host
        self.log_path = Path(log_dir) / f"engine_{self.rank}.log"
        self.startup_timeout_s = float(startup_timeout_s)
        self.request_timeout_s = float(request_timeout_s)
        self.shutdown_grace_s = float(shutdown_grace_s)
        self.process: Optional[subprocess.Popen] = None
        self.port: Optional[int] = None
        self._port_dir: Optional[str] = None
        self._launched_at = 0.0

    # ---------------------------------------------------------------- to implement
    def _launch(self, port_file: str) -> subprocess.Popen:
        """Start the server so that it binds a port on `self.host` and writes it to `port_file`."""
        raise NotImplementedError

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> str:
        """Launch and wait until healthy; returns the URL. Raises EngineStartupError on failure."""
        self.launch()
        return self.wait_until_ready()

    def launch(self) -> None:
        """Start the process without waiting (call `wait_until_ready()` next): lets callers start
        several engines in parallel."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"engine {self.rank} is already running (pid {self.process.pid})")
        self.port = None
        self._port_dir = tempfile.mkdtemp(prefix=f"slime_engine_{self.rank}_")
        self._launched_at = time.monotonic()
        self.process = self._launch(os.path.join(self._port_dir, "port"))
        logger.info("engine %d (%s) launched, pid %d, log %s", self.rank, self.name, self.process.pid, self.log_path)

    def wait_until_ready(self) -> str:
        """Read the port file, then poll GET /health_generate (every 0.2-2 s) until 200."""
        deadline = self._launched_at + self.startup_timeout_s
        port_file = os.path.join(self._port_dir, "port")
        try:
            while self.port is None:
                self._check_alive("before writing its port file")
                try:
                    text = Path(port_file).read_text().strip()
                    self.port = int(text) if text else None
                except (FileNotFoundError, ValueError):
                    pass
                if self.port is None:
                    self._check_deadline(deadline, "to write its port file")
                    time.sleep(0.05)
            interval = 0.2
            while True:
                self._check_alive("before becoming healthy")
                if self.is_healthy(timeout=max(1.0, min(30.0, deadline - time.monotonic()))):
                    break
                self._check_deadline(deadline, "to answer GET /health_generate with 200")
                time.sleep(interval)
                interval = min(2.0, interval * 1.5)
        except BaseException:
            self.shutdown()
            raise
        finally:
            _remove_dir(self._port_dir)
        logger.info("engine %d ready at %s after %.1f s", self.rank, self.url, time.monotonic() - self._launched_at)
        return self.url

    def _check_alive(self, when: str) -> None:
        if self.process is None or self.process.poll() is not None:
            code = None if self.process is None else self.process.returncode
            raise EngineStartupError(
                f"engine {self.rank} exited with status {code} {when}; last log lines of {self.log_path}:\n"
                f"{log_tail(self.log_path)}"
            )

    def _check_deadline(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            raise EngineStartupError(
                f"engine {self.rank} took longer than {self.startup_timeout_s:.0f} s {what}; last log lines of "
                f"{self.log_path}:\n{log_tail(self.log_path)}"
            )

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"engine {self.rank} has no port yet: call start()")
        return http_url(self.host, self.port)

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def shutdown(self) -> None:
        """SIGTERM the server's process group, SIGKILL after the grace period. Idempotent."""
        proc, self.process = self.process, None
        if proc is not None:
            terminate_process(proc, grace_s=self.shutdown_grace_s)
            logger.info("engine %d stopped (status %s)", self.rank, proc.returncode)

    # ---------------------------------------------------------------- SGLang control calls
    def _get(self, path: str, timeout: Optional[float] = None) -> Any:
        return http_client.get(self.url + path, timeout=timeout or self.request_timeout_s)

    def _post(self, path: str, payload: Any = None, timeout: Optional[float] = None) -> Any:
        return http_client.post(self.url + path, payload, timeout=timeout or self.request_timeout_s)

    def is_healthy(self, timeout: float = 10.0) -> bool:
        """True iff GET /health_generate answers 200 within `timeout` seconds."""
        try:
            status, _ = http_client.request("GET", self.url + "/health_generate", timeout=timeout)
        except EngineHTTPError:
            return False
        return status == 200

    def flush_cache(self, max_attempts: int = 60, interval_s: float = 1.0) -> None:
        """GET /flush_cache, retried while non-200 (SGLang refuses while requests run)."""
        status, last = None, None
        for _ in range(max(1, max_attempts)):
            status, last = http_client.request("GET", self.url + "/flush_cache", timeout=self.request_timeout_s)
            if status == 200:
                return
            time.sleep(interval_s)
        raise EngineHTTPError("GET", self.url + "/flush_cache", status, f"still failing after {max_attempts} tries: {last}")

    def pause_generation(self, mode: Optional[str] = None) -> None:
        """POST /pause_generation; SGLang's default mode aborts in-flight requests, new ones wait."""
        self._post("/pause_generation", {} if mode is None else {"mode": mode})

    def continue_generation(self) -> None:
        self._post("/continue_generation", {})

    def update_weights_from_disk(
        self, path: str, weight_version: Optional[str] = None, load_format: Optional[str] = None,
        timeout: float = 600.0,
    ) -> dict:
        """POST /update_weights_from_disk; raises EngineHTTPError unless it reports success."""
        payload: dict[str, Any] = {"model_path": str(path)}
        if weight_version is not None:
            payload["weight_version"] = str(weight_version)
        if load_format is not None:
            payload["load_format"] = load_format
        url = self.url + "/update_weights_from_disk"
        status, body = http_client.request("POST", url, payload, timeout=timeout)
        if status != 200 or not (isinstance(body, dict) and body.get("success")):
            raise EngineHTTPError("POST", url, status, str(body))
        return body

    def release_memory(self, tags: Optional[Sequence[str]] = None) -> None:
        """POST /release_memory_occupation (all tags when None: weights, kv_cache, cuda_graph)."""
        self._post("/release_memory_occupation", {} if tags is None else {"tags": list(tags)})

    def resume_memory(self, tags: Optional[Sequence[str]] = None) -> None:
        self._post("/resume_memory_occupation", {} if tags is None else {"tags": list(tags)})

    def abort_all(self) -> None:
        self._post("/abort_request", {"abort_all": True})

    def get_weight_version(self) -> str:
        return str(self._get("/get_weight_version")["weight_version"])

    def loads(self) -> dict:
        """GET /v1/loads (engine-specific shape; the hf engine's is documented in its server)."""
        return self._get("/v1/loads?include=core")

    def __repr__(self) -> str:
        where = http_url(self.host, self.port) if self.port else "not started"
        return f"{type(self).__name__}(rank={self.rank}, {where})"


def _remove_dir(path: Optional[str]) -> None:
    if not path:
        return
    for name in os.listdir(path) if os.path.isdir(path) else []:
        try:
            os.remove(os.path.join(path, name))
        except OSError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass


# -------------------------------------------------------------------- registry
ENGINES: dict[str, type[HTTPEngine]] = {}
# Built-in backends, imported on first use so that `import slime.engine.base` stays light.
_BUILTIN_MODULES = {"hf": "slime.engine.hf.engine"}


def register_engine(name: str) -> Callable[[type[HTTPEngine]], type[HTTPEngine]]:
    """Class decorator: make an HTTPEngine subclass selectable as `rollout.engine=<name>`."""

    def deco(cls: type[HTTPEngine]) -> type[HTTPEngine]:
        if not issubclass(cls, HTTPEngine):
            raise TypeError(f"{cls!r} is not an HTTPEngine")
        ENGINES[name] = cls
        cls.name = name
        return cls

    return deco


def get_engine_class(name: str) -> type[HTTPEngine]:
    """The engine class registered as `name`; a clear ValueError for unknown names."""
    if name not in ENGINES and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    if name not in ENGINES:
        known = sorted(set(ENGINES) | set(_BUILTIN_MODULES))
        raise ValueError(f"unknown rollout engine {name!r}: choose one of {known} (rollout.engine=<name>)")
    return ENGINES[name]
