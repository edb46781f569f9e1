"""Launching and cleaning up server child processes (engines, the router): one helper for all.

Children run in their own session/process group (so one signal reaches the whole tree) and get
PR_SET_PDEATHSIG = SIGKILL on Linux, so they die with their parent. Caveat: Linux delivers the death
signal when the *thread* that forked the child exits, so launch from a long-lived thread (an actor's
main thread), not from a short-lived worker thread.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
# The directory that contains the `slime` package, put on the child's PYTHONPATH.
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


def _child_setup(parent_pid: int):
    """preexec_fn: SIGKILL on parent death; exit if the parent already died before prctl ran."""

    def setup() -> None:  # runs in the child between fork and exec: keep it to plain syscalls
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent_pid:
                os._exit(1)

    return setup


def child_env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The parent's environment with this project on PYTHONPATH and unbuffered Python output."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if _PROJECT_ROOT not in paths:
        paths.insert(0, _PROJECT_ROOT)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def launch_process(
    cmd: Sequence[str], *, log_path: str | Path, env: Optional[dict[str, str]] = None, cwd: Optional[str] = None
) -> subprocess.Popen:
    """Start `cmd` with stdout+stderr appended to `log_path`, in a new session, dying with us."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} launching: {' '.join(cmd)}\n".encode())
        log.flush()
        return subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env if env is not None else child_env(),
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_child_setup(os.getpid()),
        )


def terminate_process(proc: Optional[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM the process group, wait up to `grace_s` seconds, then SIGKILL it. Idempotent."""
    if proc is None:
        return
    pgid = proc.pid  # start_new_session=True: the child leads its own group
    _signal_group(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    # The leader may be gone while group members linger: always finish with SIGKILL.
    _signal_group(pgid, signal.SIGKILL)
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def log_tail(path: str | Path, max_bytes: int = 4000) -> str:
    """The last `max_bytes` bytes of a log file, decoded leniently ('' if missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def cli_flags(args: dict[str, Any]) -> list[str]:
    """`{"cache_threshold": 0.3, "disable_x": True, "ids": [1, 2]}` → `--cache-threshold 0.3 --disable-x --ids 1 2`.

    The argparse convention SGLang and sglang-router share: True → a bare flag; False/None → omitted;
    lists → one flag followed by each value; dicts → one JSON value.
    """
    flags: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            flags += [flag, *map(str, value)]
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def http_url(host: str, port: int) -> str:
    """`http://host:port`, with brackets around IPv6 hosts."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
