"""Port reservation on one node: servers get ports the framework chose, never ports they guessed.

A port is reserved by holding an exclusive `flock` on `<lock dir>/<port>.lock` AND finding it
bindable on the host at that moment. Every process of every run on the node uses the same lock
directory, so two engines (of one run or of two concurrent runs) never receive the same port; the
lock dies with the process that holds it, so a crashed run leaves no stale reservation. Ports come
from a range below Linux's ephemeral range (32768+), where the kernel's own picks for outgoing
connections cannot collide with them (slime starts engines at 15000 for the same reason).

Between `reserve_ports` and the server's own bind the port is not held open (a server cannot bind a
port we hold): a process outside the framework could take it in that window, and the server's
startup then fails with its log tail, as any failed start does.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

from slime.net import ENGINE_PORTS, bindable

DEFAULT_FIRST_PORT, DEFAULT_LAST_PORT = ENGINE_PORTS  # below the default ephemeral range 32768-60999


def _lock_dir() -> Path:
    path = Path(os.environ.get("SLIME_PORT_LOCK_DIR") or Path(tempfile.gettempdir()) / f"slime-ports-{os.getuid()}")
    path.mkdir(parents=True, exist_ok=True)
    return path


class PortLease:
    """Ports reserved for one server; `release()` (or the holder's exit) frees them."""

    def __init__(self, ports: list[int], handles: list[int]):
        self.ports = ports
        self._handles = handles

    def release(self) -> None:
        for fd in self._handles:
            try:
                os.close(fd)  # closing drops the flock
            except OSError:
                pass
        self._handles = []

    def __repr__(self) -> str:
        return f"PortLease({self.ports})"


def reserve_ports(
    host: str, count: int, *, first: int = DEFAULT_FIRST_PORT, last: int = DEFAULT_LAST_PORT
) -> PortLease:
    """Reserve `count` distinct ports in [first, last] that are bindable on `host`.

    Raises RuntimeError when the range holds fewer free ports than asked for.
    """
    lock_dir = _lock_dir()
    ports: list[int] = []
    handles: list[int] = []
    # Start at a pid-dependent offset so concurrent runs rarely contend for the same locks.
    span = last - first + 1
    offset = (os.getpid() * 7919) % span
    for i in range(span):
        if len(ports) == count:
            break
        port = first + (offset + i) % span
        fd = os.open(lock_dir / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if bindable(host, port):
            ports.append(port)
            handles.append(fd)
        else:
            os.close(fd)
    if len(ports) < count:
        PortLease(ports, handles).release()
        raise RuntimeError(f"only {len(ports)} of {count} ports free on {host} in [{first}, {last}]")
    return PortLease(ports, handles)
