"""vllm-router 0.1.17 (`python -m vllm_router.launch_router`): launch one (or join a given one), register workers.

Its worker API, as measured on the installed package:

    POST /add_worker?url=U      200 "Successfully added worker: U" once GET U/health answered 200
    POST /remove_worker?url=U   200, synchronous (traffic stops at once; unknown URLs also answer 200)
    GET  /workers               {"workers": [{url, worker_type, is_healthy, ...}], "total", "stats"}

In PD mode (`--vllm-pd-disaggregation`) workers cannot be added over HTTP ("PD router requires specific
add_prefill_server or add_decode_server methods") and the router refuses to start without `--prefill` and
`--decode` URLs: this class keeps the PD lists and (re)starts the router process on the same port with them
once both kinds are known, again whenever a worker is added back (a restart after a crash); removal goes
through POST /remove_worker in both modes. The router runs a prefill server with max_tokens=1 and
`kv_transfer_params`, then the decode server with the prefill's `kv_transfer_params`.

Its circuit breaker is off, as sglang-router's (`Router.health_switches`); its health checks stay on: vllm-router
has no switch for them, and vLLM's GET /health generates nothing (it asks the engine core whether it is alive).
"""

from __future__ import annotations

import time
import urllib.parse
from typing import TYPE_CHECKING, Any, Optional

from slime.engine import http_client
from slime.engine.process import terminate_process
from slime.engine.router import Router, RouterError, check_health_switch, health_switch_flags
from slime.engine.vllm.engine_args import router_flags

if TYPE_CHECKING:
    from slime.config.schema import RouterConfig


class VLLMRouter(Router):
    """Handle on a vllm-router; see the module docstring."""

    launch_module = "vllm_router.launch_router"
    health_switches = {"disable_circuit_breaker": "cb_"}

    def __init__(self, url: str, process=None, log_path=None):
        super().__init__(url, process, log_path)
        self.prefill: list[tuple[str, Optional[int]]] = []  # PD: (url, bootstrap port)
        self.decode: list[str] = []

    def flags(self, host: str, port: int, prom_port: int, cfg: RouterConfig, pd: bool) -> list[str]:
        for key, value in cfg.extra_args.items():
            check_health_switch(key, value, self.health_switches)
        flags = [
            *("--host", host, "--port", str(port), "--policy", cfg.policy),
            *("--prometheus-host", host, "--prometheus-port", str(prom_port)),
            *("--request-timeout-secs", str(cfg.request_timeout_secs), "--log-level", "warning"),
            *health_switch_flags(self.health_switches),
            *router_flags(cfg.extra_args),
        ]
        if pd:
            flags.append("--vllm-pd-disaggregation")
            for url, bootstrap in self.prefill:
                flags += ["--prefill", url, *([str(bootstrap)] if bootstrap is not None else [])]
            for url in self.decode:
                flags += ["--decode", url]
        return flags

    @property
    def pd(self) -> bool:
        return bool(self._launch and self._launch[4])

    def start_process(self) -> None:
        if self.pd and not (self.prefill and self.decode):
            return  # started once both a prefill and a decode server are registered
        super().start_process()

    def _restart(self) -> None:
        if self.process is not None:
            proc, self.process = self.process, None
            terminate_process(proc, grace_s=5.0)
        self.start_process()

    def list_workers(self) -> list[dict]:
        if self.pd and self.process is None:
            return []
        return list(http_client.get(self.url + "/workers", timeout=30.0).get("workers", []))

    def add_worker(
        self, url: str, timeout_s: float = 60.0, *, worker_type: str = "regular", bootstrap_port: Optional[int] = None
    ) -> None:
        """Register `url` (regular: POST /add_worker, which waits for its health; PD: restart with the lists)."""
        if worker_type == "regular" and not self.pd:
            query = urllib.parse.urlencode({"url": url})
            http_client.post(f"{self.url}/add_worker?{query}", timeout=timeout_s)
            return
        if not self.pd:
            raise RouterError(f"{self.url} is not a PD router; cannot add {worker_type} worker {url}")
        if self._launch is None:
            raise RouterError(f"a PD vllm-router given by address takes workers only from its own command line: {url}")
        if url in [u for u, _ in self.prefill] + self.decode:
            raise RouterError(f"worker {url} is already registered with {self.url}")
        if worker_type == "prefill":
            self.prefill.append((url, bootstrap_port))
        elif worker_type == "decode":
            self.decode.append(url)
        else:
            raise RouterError(f"a PD router takes prefill or decode workers, not {worker_type!r}")
        if self.prefill and self.decode:
            self._restart()
            self._wait_listed(url, timeout_s)

    def _wait_listed(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(w.get("url") == url and w.get("is_healthy") for w in self.list_workers()):
            if time.monotonic() > deadline:
                raise RouterError(f"worker {url} not healthy in the router after {timeout_s:.0f} s")
            time.sleep(0.05)

    def remove_worker(self, url: str, timeout_s: float = 30.0) -> bool:
        """POST /remove_worker?url=; False if `url` was not registered."""
        listed = any(w.get("url") == url for w in self.list_workers())
        self.prefill = [(u, b) for u, b in self.prefill if u != url]
        self.decode = [u for u in self.decode if u != url]
        if not listed:
            return False
        http_client.post(f"{self.url}/remove_worker?{urllib.parse.urlencode({'url': url})}", timeout=timeout_s)
        return True

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "pd": self.pd, "prefill": self.prefill, "decode": self.decode}
