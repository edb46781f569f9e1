"""Network addresses for rendezvous and servers: a free port, this machine's address towards a host.

A leaf imported by the runtime, trainers, syncs and engines; it imports no slime package.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

# The engines' servers reserve their ports in this range (`slime.engine.ports.reserve_ports`, under a lock per port).
ENGINE_PORTS = (15000, 32000)
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")  # the kernel's picks for bind(0) and connect()


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def bindable(host: str, port: int) -> bool:
    """Whether a listener could bind `host:port` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on `host` a moment ago, chosen at random above the engines' range and below the
    kernel's ephemeral range (32001-32767 by default), where no outgoing connection's or port-0 listener's port can
    land; the kernel's own pick (bind to 0) when that window is empty or full.

    Small race: another process may take the port between this check and the listener's bind; use it only where
    the listener cannot report its own port (torch's rendezvous of several ranks, sglang-router: no port-0 option).
    Engines' own ports come from `slime.engine.ports.reserve_ports`, which holds a lock per port.
    """
    window = list(range(ENGINE_PORTS[1] + 1, _ephemeral_start()))
    random.SystemRandom().shuffle(window)  # concurrent callers start at different ports
    for port in window:
        if bindable(host, port):
            return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def local_address_towards(host: str) -> str:
    """This machine's IP on the route to `host` (no packet is sent); 127.0.0.1 for a loopback host."""
    if host in LOOPBACK_HOSTS:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def reached_at(bind_host: str, node_ip: str | None) -> str:
    """The address others reach a server bound to `bind_host` at: its node's IP when it binds every interface (a
    wildcard address is no destination), else `bind_host` itself."""
    if bind_host in WILDCARD_HOSTS:
        if node_ip is None:
            raise ValueError(f"a server bound to {bind_host!r} needs its node's IP to be reached at")
        return node_ip
    return bind_host


def unreachable(host: str, port: int, timeout_s: float) -> str | None:
    """Why nothing accepts a TCP connection at host:port within `timeout_s` seconds; None when something does."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
