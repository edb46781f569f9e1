"""A small synchronous JSON-over-HTTP client (stdlib urllib) for control-plane calls.

Proxies are bypassed (engines and routers are addressed directly). Every failure raises
`EngineHTTPError` naming the method, URL, status and (truncated) body; a connection failure has
status None.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Optional

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_MAX_BODY_CHARS = 2000


class EngineHTTPError(RuntimeError):
    """An HTTP call that failed: no response (status None) or a status the caller cannot accept."""

    def __init__(self, method: str, url: str, status: Optional[int], body: str):
        self.method, self.url, self.status, self.body = method, url, status, body
        what = f"HTTP {status}" if status is not None else "connection failed"
        super().__init__(f"{method} {url}: {what}: {body[:_MAX_BODY_CHARS]}")

    def __reduce__(self):  # crosses Ray's process boundary whole (the default would call __init__(message))
        return (EngineHTTPError, (self.method, self.url, self.status, self.body))


def request(method: str, url: str, payload: Any = None, *, timeout: float = 30.0) -> tuple[int, Any]:
    """Send one request; return (status, body) for any HTTP status (JSON-decoded when possible).

    `timeout` is in seconds. Raises EngineHTTPError only when no HTTP response arrives.
    """
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    except (urllib.error.URLError, OSError) as err:
        raise EngineHTTPError(method, url, None, repr(getattr(err, "reason", err))) from err
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text) if text else None
    except json.JSONDecodeError:
        return status, text


def call(method: str, url: str, payload: Any = None, *, timeout: float = 30.0) -> Any:
    """Like `request` but raise EngineHTTPError unless the status is 2xx; returns the body."""
    status, body = request(method, url, payload, timeout=timeout)
    if not 200 <= status < 300:
        raise EngineHTTPError(method, url, status, body if isinstance(body, str) else json.dumps(body))
    return body


def get(url: str, *, timeout: float = 30.0) -> Any:
    return call("GET", url, timeout=timeout)


def post(url: str, payload: Any = None, *, timeout: float = 30.0) -> Any:
    return call("POST", url, {} if payload is None else payload, timeout=timeout)


def delete(url: str, *, timeout: float = 30.0) -> Any:
    return call("DELETE", url, timeout=timeout)
