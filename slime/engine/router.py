"""sglang-router: launch one (or join a user-given one), register and remove workers.

The router is the stock Rust `sglang_router` (0.3.2 API: `POST /workers`, `GET /workers`,
`DELETE /workers/{id}`; the legacy `/add_worker` is gone). `Router.launch` reserves its HTTP and
Prometheus ports as engines do (`slime.engine.ports.reserve_ports`, a lock per port held while the router lives):
the router cannot report a port it bound itself, and a port merely probed free could be another run's router,
whose /health would then answer for ours. vLLM servers register
with vllm-router instead (`slime.engine.vllm.router.VLLMRouter`, the same interface); an engine kind names
its router class (`EngineServer.router_class`).

The router's own worker health checks and circuit breaker are off and stay off (`HEALTH_SWITCHES`): engine
health is the fleet's (`rollout.fault_tolerance`), which probes only while the engines serve.
`DROPPED_SAMPLING_PARAMS` are the SGLang sampling params this router does not forward.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from slime.engine import http_client
from slime.engine.http_client import EngineHTTPError
from slime.engine.ports import PortLease, reserve_ports
from slime.engine.process import cli_flags, http_url, launch_process, log_tail, terminate_process
from slime.net import reached_at

if TYPE_CHECKING:  # only attributes are read: importable without omegaconf
    from slime.config.schema import RouterConfig

logger = logging.getLogger(__name__)

# launch_router flags this class sets itself; extra_args may not override them.
_OWNED_FLAGS = {"host", "port", "prometheus_host", "prometheus_port", "policy", "request_timeout_secs"}

# Router features the framework switches off, as slime launches its router (slime/ray/rollout.py:_start_router):
# switch flag -> the prefix of the flags that tune what it switches off. A router health probe is SGLang's GET
# /health, a one-token generation (sglang/srt/entrypoints/http_server.py:health_generate): on a colocated engine
# it would generate on released memory, and one in flight breaks release_memory_occupation's idle assertion
# (sglang/srt/managers/scheduler_components/weight_updater.py). The circuit breaker takes workers out after
# failed or slow requests (a long weight push) on its own. Engine health is rollout.fault_tolerance's.
HEALTH_SWITCHES: Mapping[str, str] = {"disable_health_check": "health_", "disable_circuit_breaker": "cb_"}

# SGLang 0.5.23 SamplingParams fields (sglang/srt/sampling/sampling_params.py) that sglang-router 0.3.2 does not
# forward in a /generate body (its request type has no such field): the engine would sample without them.
# Measured with the real router by tests/engine/test_router_contract.py.
# The top-level /generate fields of SGLang 0.5.23's GenerateReqInput the rollout sends that sglang-router 0.3.2 does
# not forward either (tests/engine/test_router_contract.py): a request carrying one goes to a worker directly.
DROPPED_REQUEST_FIELDS = frozenset({"return_routed_experts"})
DROPPED_SAMPLING_PARAMS = frozenset(
    {
        "stop_regex",
        "beam_width",
        "structural_tag",
        "spaces_between_special_tokens",
        "stream_interval",
        "logit_bias",
        "custom_params",
        "watermark",
        "stop_strs",
        "stop_regex_strs",
        "stop_str_max_len",
        "stop_regex_max_len",
        "is_normalized",
        "ebnf_full_assistant",
    }
)


class RouterError(RuntimeError):
    """The router did not start, did not become healthy, or did not take a worker in time."""


def router_flags(extra_args: dict[str, Any]) -> list[str]:
    """`{"cache_threshold": 0.3, "disable_health_check": True}` → `--cache-threshold 0.3 --disable-health-check`.

    True → bare flag; False/None → omitted; lists → one flag followed by each value. ValueError for a flag the
    framework sets, or one that would turn a `HEALTH_SWITCHES` feature back on or tune it.
    """
    for key, value in extra_args.items():
        if key.replace("-", "_") in _OWNED_FLAGS:
            raise ValueError(
                f"rollout.router.extra_args.{key} is set by the framework; use rollout.router.policy / "
                f"request_timeout_secs / cluster.host instead"
            )
        check_health_switch(key, value, HEALTH_SWITCHES)
    return cli_flags(extra_args)


def check_health_switch(key: str, value: Any, switches: Mapping[str, str]) -> None:
    """ValueError naming `rollout.router.extra_args.<key>` when `health_switch_error` finds one."""
    error = health_switch_error(key, value, switches)
    if error:
        raise ValueError(f"rollout.router.extra_args.{key}: {error}")


def health_switch_error(key: str, value: Any, switches: Mapping[str, str]) -> Optional[str]:
    """Why `extra_args.<key>=value` is refused: it would turn a switched-off router feature back on (a switch set
    to anything but true) or tune it (a flag with the switch's prefix); None when it does neither."""
    name = key.replace("-", "_")
    for switch, prefix in switches.items():
        if name == switch and value is not True or name != switch and name.startswith(prefix):
            return f"{_SWITCHED_OFF[switch]} (--{_flag(switch)}, set by the framework); engine health is rollout.fault_tolerance's"
    return None


_SWITCHED_OFF = {
    "disable_health_check": "the router's own health checks stay off: each probe is a generation on the engine, "
    "which hangs while generation is paused and breaks an engine that released its memory",
    "disable_circuit_breaker": "the router's circuit breaker stays off: it takes engines out after failed or slow "
    "requests (a long weight push) on its own",
}


def health_switch_flags(switches: Mapping[str, str]) -> list[str]:
    """The framework's switch flags, e.g. `--disable-health-check --disable-circuit-breaker`."""
    return ["--" + _flag(switch) for switch in switches]


def _flag(name: str) -> str:
    return name.replace("_", "-")


class Router:
    """Handle on an sglang-router. Use `Router.launch(...)` or `Router.connect(address)`.

    Subclasses for other router packages (vllm-router) override `launch_module`, `flags` and the worker calls."""

    launch_module = "sglang_router.launch_router"
    health_switches: Mapping[str, str] = HEALTH_SWITCHES

    def __init__(self, url: str, process: Optional[subprocess.Popen] = None, log_path: Optional[Path] = None):
        self._url = url.rstrip("/")
        self.process = process
        self.log_path = log_path
        self._launch: Optional[tuple[str, int, int, Any, bool]] = None  # (host, port, prometheus port, cfg, pd)
        self._lease: Optional[PortLease] = None

    @classmethod
    def launch(
        cls,
        *,
        host: str = "127.0.0.1",
        cfg: RouterConfig,
        log_path: str | Path,
        pd: bool = False,
        node_ip: Optional[str] = None,
    ) -> Router:
        """Start `python -m <launch_module>` bound to `host` (PD mode when `pd`), wait for GET /health = 200 (at
        most `cfg.startup_timeout_s` seconds); raise RouterError with the log tail. `node_ip`: this node's IP, where
        a router bound to a wildcard `host` is reached."""
        lease = reserve_ports(host, 2)
        port, prom_port = lease.ports
        router = cls(http_url(reached_at(host, node_ip), port), None, Path(log_path))
        router._launch, router._lease = (host, port, prom_port, cfg, pd), lease
        try:
            router.start_process()
        except BaseException:
            lease.release()
            raise
        return router

    def flags(self, host: str, port: int, prom_port: int, cfg: RouterConfig, pd: bool) -> list[str]:
        """The router's command-line flags (after `python -m <launch_module>`)."""
        return [
            *("--host", host, "--port", str(port), "--policy", cfg.policy),
            *("--prometheus-host", host, "--prometheus-port", str(prom_port)),
            *("--request-timeout-secs", str(cfg.request_timeout_secs), "--log-level", "warn"),
            *health_switch_flags(self.health_switches),
            *router_flags(cfg.extra_args),  # a redundant `disable_health_check: true` repeats a bare flag: harmless
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

    def describe(self) -> dict[str, Any]:
        """`{url, pid, log}` of a router this run launched (pid None before its process starts), `{url, external}` of a
        joined one: what engines.json lists."""
        if self.log_path is None:
            return {"url": self.url, "external": True}
        return {"url": self.url, "pid": self.process.pid if self.process else None, "log": str(self.log_path)}

    def death(self) -> Optional[str]:
        """None while the router process this run launched lives (a joined router: always None); else what ended
        it: its exit status and its log's tail."""
        if self.process is None or self.process.poll() is None:
            return None
        return (
            f"the router at {self.url} (pid {self.process.pid}) died with exit status {self.process.returncode}; "
            f"log tail of {self.log_path}:\n{log_tail(self.log_path, max_bytes=1500)}"
        )

    def shutdown(self) -> None:
        """Stop a launched router and free its ports (idempotent); a connected router is left alone."""
        proc, self.process = self.process, None
        if proc is not None:
            terminate_process(proc, grace_s=5.0)
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    def __repr__(self) -> str:
        return f"Router({self.url}, {'launched' if self.process else 'external'})"
