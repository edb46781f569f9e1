"""sglang-router: launch one (or join a user-given one), register and remove workers.

The router is the stock Rust `sglang_router` (0.3.2 API: `POST /workers`, `GET /workers`,
`DELETE /workers/{id}`; the legacy `/add_worker` is gone). `Router.launch` picks its HTTP and
Prometheus ports by bind-probing (the router cannot report a port it bound itself). vLLM servers register
with vllm-router instead (`slime.engine.vllm.router.VLLMRouter`, the same interface); an engine kind names
its router class (`EngineServer.router_class`).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from slime.engine import http_client
from slime.engine.http_client import EngineHTTPError
from slime.engine.process import cli_flags, free_port, http_url, launch_process, log_tail, terminate_process

if TYPE_CHECKING:  # only attributes are read: importable without omegaconf
    from slime.config.schema import RouterConfig

logger = logging.getLogger(__name__)

# launch_router flags this class sets itself; extra_args may not override them.
_OWNED_FLAGS = {"host", "port", "prometheus_host", "prometheus_port", "policy", "request_timeout_secs"}


class RouterError(RuntimeError):
    """The router did not start, did not become healthy, or did not take a worker in time."""


def router_flags(extra_args: dict[str, Any]) -> list[str]:
    """`{"cache_threshold": 0.3, "disable_health_check": True}` → `--cache-threshold 0.3 --disable-health-check`.

    True → bare flag; False/None → omitted; lists → one flag followed by each value.
    """
    for key in extra_args:
        if key.replace("-", "_") in _OWNED_FLAGS:
            raise ValueError(
                f"rollout.router.extra_args.{key} is set by the framework; use rollout.router.policy / "
                f"request_timeout_secs / cluster.host instead"
            )
    return cli_flags(extra_args)


class Router:
    """Handle on an sglang-router. Use `Router.launch(...)` or `Router.connect(address)`.

    Subclasses for other router packages (vllm-router) override `launch_module`, `flags` and the worker calls."""

    launch_module = "sglang_router.launch_router"

    def __init__(self, url: str, process: Optional[subprocess.Popen] = None, log_path: Optional[Path] = None):
        self._url = url.rstrip("/")
        self.process = process
        self.log_path = log_path
        self._launch: Optional[tuple[str, int, int, Any, bool]] = None  # (host, port, prometheus port, cfg, pd)

    @classmethod
    def launch(cls, *, host: str = "127.0.0.1", cfg: RouterConfig, log_path: str | Path, pd: bool = False) -> Router:
        """Start `python -m <launch_module>` bound to `host` (PD mode when `pd`), wait for GET /health = 200 (at
        most `cfg.startup_timeout_s` seconds); raise RouterError with the log tail."""
        port, prom_port = free_port(host), free_port(host)  # racy by nature; see free_port
        router = cls(http_url(host, port), None, Path(log_path))
        router._launch = (host, port, prom_port, cfg, pd)
        router.start_process()
        return router

    def flags(self, host: str, port: int, prom_port: int, cfg: RouterConfig, pd: bool) -> list[str]:
        """The router's command-line flags (after `python -m <launch_module>`)."""
        return [
            *("--host", host, "--port", str(port), "--policy", cfg.policy),
            *("--prometheus-host", host, "--prometheus-port", str(prom_port)),
            *("--request-timeout-secs", str(cfg.request_timeout_secs), "--log-level", "warn"),
            *router_flags(cfg.extra_args),
            *(["--pd-disaggregation"] if pd else []),
        ]

    def start_process(self) -> None:
        """(Re)start the launched router's process on its port and wait until it is healthy."""
        host, port, prom_port, cfg, pd = self._launch
        cmd = [sys.executable, "-m", self.launch_module, *self.flags(host, port, prom_port, cfg, pd)]
        self.process = launch_process(cmd, log_path=self.log_path)
        try:
            self._wait_healthy(cfg.startup_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        logger.info("router ready at %s (pid %d, log %s)", self.url, self.process.pid, self.log_path)

    @classmethod
    def connect(cls, address: str) -> Router:
        """A user-given router ("host:port" or "http://host:port"); `shutdown()` leaves it running."""
        url = address if "://" in address else f"http://{address}"
        try:
            http_client.get(url.rstrip("/") + "/health", timeout=10.0)
        except EngineHTTPError as exc:
            raise RouterError(
                f"rollout.router.address={address}: the router does not answer ({exc}); start it, or set "
                "rollout.router.address=null to let the run launch its own"
            ) from None
        return cls(url)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RouterError(
                    f"router exited with status {self.process.returncode}; log tail of {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            try:
                status, _ = http_client.request("GET", self.url + "/health", timeout=2.0)
                if status == 200:
                    return
            except EngineHTTPError:
                pass
            if time.monotonic() > deadline:
                raise RouterError(
                    f"router not healthy after {timeout_s:.0f} s; log tail of {self.log_path}:\n{log_tail(self.log_path)}"
                )
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return self._url

    def list_workers(self) -> list[dict]:
        """GET /workers → the `workers` list (dicts with id, url, is_healthy, load, metadata, ...)."""
        return list(http_client.get(self.url + "/workers", timeout=30.0).get("workers", []))

    def add_worker(
        self, url: str, timeout_s: float = 60.0, *, worker_type: str = "regular", bootstrap_port: Optional[int] = None
    ) -> None:
        """POST /workers {url, worker_type[, bootstrap_port]}; wait (≤ timeout_s seconds) until it is healthy."""
        body: dict[str, Any] = {"url": url, "worker_type": worker_type}
        if bootstrap_port is not None:
            body["bootstrap_port"] = int(bootstrap_port)
        http_client.post(self.url + "/workers", body, timeout=30.0)
        deadline = time.monotonic() + timeout_s
        workers: list[dict] = []
        while time.monotonic() < deadline:
            workers = self.list_workers()
            if any(w.get("url") == url and w.get("is_healthy") for w in workers):
                return
            time.sleep(0.05)
        raise RouterError(f"worker {url} not healthy in the router after {timeout_s:.0f} s; workers: {workers}")

    def remove_worker(self, url: str, timeout_s: float = 30.0) -> bool:
        """DELETE /workers/{id} of the worker registered with `url`, then wait (≤ timeout_s seconds)
        until GET /workers no longer lists it (the DELETE is answered 202 before it takes effect).
        Returns False if `url` was not registered."""
        ids = [w["id"] for w in self.list_workers() if w.get("url") == url]
        if not ids:
            return False
        for worker_id in ids:
            http_client.delete(self.url + "/workers/" + urllib.parse.quote(str(worker_id), safe=""), timeout=30.0)
        deadline = time.monotonic() + timeout_s
        while any(w.get("url") == url for w in self.list_workers()):
            if time.monotonic() > deadline:
                raise RouterError(f"worker {url} still listed by the router {timeout_s:.0f} s after DELETE")
            time.sleep(0.02)
        return True

    def shutdown(self) -> None:
        """Stop a launched router (idempotent); a connected router is left alone."""
        proc, self.process = self.process, None
        if proc is not None:
            terminate_process(proc, grace_s=5.0)

    def __repr__(self) -> str:
        return f"Router({self.url}, {'launched' if self.process else 'external'})"
