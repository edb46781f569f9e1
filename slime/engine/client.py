"""`EngineClient`: the SGLang HTTP control calls on one engine URL (REFERENCE.md §7.2).

Plain HTTP, no process and no Ray: the engine's launcher, the weight-sync classes, the rollout
manager and the tests all talk to a server through this, whoever started it (an external engine
included). Timeouts are in seconds.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

from slime.engine import http_client
from slime.engine.http_client import EngineHTTPError


class EngineClient:
    """Control calls of one SGLang-compatible server at `url` (`http://host:port`)."""

    def __init__(self, url: str, *, timeout_s: float = 60.0):
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)

    def _get(self, path: str, timeout: Optional[float] = None) -> Any:
        return http_client.get(self.url + path, timeout=timeout or self.timeout_s)

    def _post(self, path: str, payload: Any = None, timeout: Optional[float] = None) -> Any:
        return http_client.post(self.url + path, payload, timeout=timeout or self.timeout_s)

    def is_healthy(self, path: str = "/health_generate", timeout: float = 10.0) -> bool:
        """True iff GET `path` answers 200 within `timeout` seconds."""
        try:
            status, _ = http_client.request("GET", self.url + path, timeout=timeout)
        except EngineHTTPError:
            return False
        return status == 200

    def flush_cache(self, max_attempts: int = 60, interval_s: float = 1.0) -> None:
        """GET /flush_cache, retried while non-200 (SGLang refuses while requests run)."""
        status, last = None, None
        for _ in range(max(1, max_attempts)):
            status, last = http_client.request("GET", self.url + "/flush_cache", timeout=self.timeout_s)
            if status == 200:
                return
            time.sleep(interval_s)
        raise EngineHTTPError("GET", self.url + "/flush_cache", status, f"still failing after {max_attempts} tries: {last}")

    def pause_generation(self, mode: Optional[str] = None) -> None:
        """POST /pause_generation; SGLang's default mode aborts in-flight requests, new ones wait."""
        self._post("/pause_generation", {} if mode is None else {"mode": mode})

    def continue_generation(self) -> None:
        self._post("/continue_generation", {})

    def update_weights_from_disk(self, path: str, weight_version: Optional[str] = None,
                                 load_format: Optional[str] = None, timeout: float = 600.0) -> dict:
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
        return f"EngineClient({self.url})"
