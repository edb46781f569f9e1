"""Ports a test holds itself, where runs beside it (the end-to-end pool) take ports of the real windows."""

from __future__ import annotations

import socket


def hold_consecutive_ports(starts, *, count: int) -> list[socket.socket]:
    """Listeners on `count` consecutive free 127.0.0.1 ports, the first from `starts` (the caller closes them)."""
    for start in starts:
        held = []
        for port in range(start, start + count):
            busy = socket.socket()
            try:
                busy.bind(("127.0.0.1", port))
            except OSError:
                busy.close()
                break
            busy.listen()
            held.append(busy)
        if len(held) == count:
            return held
        for busy in held:
            busy.close()
    raise AssertionError(f"no {count} consecutive free ports from {starts}")
