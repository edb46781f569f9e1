"""Every URL and address field (slime.config.input_kinds) has the form its user expects, before anything starts:
a typo such as `localhost:8000` for `http://localhost:8000` would otherwise show only when the first request
fails, after the cluster and the engines started."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional
from urllib.parse import urlsplit

from slime.config.input_kinds import ADDRESS_KINDS, typed_values
from slime.config.problems import Problem
from slime.config.schema import RunConfig

FIXES = {
    "http_url": "give it as http://host:port (or https://...)",
    "host_port": "give it as host:port or http://host:port",
    "ray_address": "give the head's host:port (its GCS port, 6379 by default), ray://host:port, auto, or null",
    "host": "give a host name or an IP address, without scheme or port",
}


def check_addresses(cfg: RunConfig) -> Iterator[Problem]:
    for key, kind, value in typed_values(cfg):
        if kind in ADDRESS_KINDS:
            what = address_problem(kind, value)
            if what is not None:
                yield Problem(key, value, what, FIXES[kind])


def address_problem(kind: str, value: Any) -> Optional[str]:
    """What is wrong with `value` as an address of `kind`; None when nothing is."""
    if not isinstance(value, str) or not value.strip() or value != value.strip() or " " in value:
        return "not an address (empty, or with spaces)"
    if kind == "http_url" or (kind == "host_port" and "://" in value):
        return _url_problem(value, schemes=("http", "https"))
    if kind == "ray_address":
        if value in ("auto", "local"):
            return None
        return _url_problem(value, schemes=("ray",)) if "://" in value else _host_port_problem(value)
    if kind == "host_port":
        return _host_port_problem(value)
    return _host_problem(value)


def _url_problem(value: str, *, schemes: tuple[str, ...]) -> Optional[str]:
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        return "not an http(s) URL" if "http" in schemes else f"not a {schemes[0]}:// URL"
    if not parts.hostname:
        return "the URL names no host"
    return _port_problem(parts)


def _host_port_problem(value: str) -> Optional[str]:
    if "://" in value or "/" in value:
        return "expected host:port"
    parts = urlsplit("//" + value)
    problem = _port_problem(parts)
    if problem is None and (not parts.hostname or parts.port is None):
        return "expected host:port (both given)"
    return problem


def _host_problem(value: str) -> Optional[str]:
    if "://" in value or "/" in value:
        return "expected a host name or IP address, not a URL"
    return None


def _port_problem(parts) -> Optional[str]:
    try:
        port = parts.port
    except ValueError:  # urllib's answer to a port that is no number in 0-65535
        return "the port is not a number in 1-65535"
    return "port 0 is no port to connect to" if port == 0 else None
