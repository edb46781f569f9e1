"""Network addresses for rendezvous and servers: a free port, this machine's address towards a host.

A leaf imported by the runtime, trainers, syncs and engines; it imports no slime package.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on `host` a moment ago (bind to 0, read it, close).

    Tiny race: another process may take the port between this close and the child's bind; use it only where
    the listener cannot report its own port (torch's rendezvous, sglang-router: no port-0/port-file option).
    Engines' own ports come from `slime.engine.ports.reserve_ports`, which holds a lock per port.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def local_address_towards(host: str) -> str:
    """This machine's IP on the route to `host` (no packet is sent); 127.0.0.1 for a loopback host."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def unreachable(host: str, port: int, timeout_s: float) -> str | None:
    """Why nothing accepts a TCP connection at host:port within `timeout_s` seconds; None when something does."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
