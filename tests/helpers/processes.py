"""The processes of this test session: which are still alive (by the session id conftest.py exports), killing those
of one run (by the run's marker main_py sets), a function run in a thread."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import psutil

# Inherited by every process the tests start (runs, Ray, routers, engines): leftovers are found by it,
# and runs of other sessions on the same machine are not mistaken for ours.
TEST_SESSION_VAR = "SLIME_TEST_SESSION"
# Set by tests.helpers.runs.main_py for one run (its run directory), inherited by its Ray workers and engines.
TEST_RUN_VAR = "SLIME_TEST_RUN"


def own_shm_segments() -> set[str]:
    """The shared-memory files in /dev/shm that torch made for this process (`torch_<pid>_...`, the file-system
    sharing the tensor sync's buckets use): other processes' segments, such as the runs beside the unit tests',
    come and go on their own."""
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"torch_{os.getpid()}_")}


def session_processes() -> list[str]:
    """Live processes (not zombies) started by this test session, as 'pid: command line'."""
    found = []
    for proc in _carrying(TEST_SESSION_VAR, os.environ[TEST_SESSION_VAR]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.info["pid"] == os.getpid():
            continue
        command = " ".join(proc.info["cmdline"] or [])
        if proc.info["ppid"] == os.getpid() and ("from multiprocessing." in command or "torch_shm_manager" in command):
            # this test process's own helpers (megatron's checkpoint Manager, spawn's resource tracker, the
            # shared-memory manager torch starts for the tensor sync's buckets)
            continue
        found.append(f"{proc.info['pid']}: {command[:120]}")
    return found


def _carrying(var: str, value: str) -> Iterator[psutil.Process]:
    """Processes whose environment holds `var`=`value` (those gone meanwhile, or not ours to read, left out)."""
    for proc in psutil.process_iter(["pid", "ppid", "cmdline", "status"]):
        try:
            if proc.environ().get(var) == value:
                yield proc
        except psutil.Error:
            continue


def in_thread(fn) -> tuple[threading.Thread, dict]:
    """Run `fn()` in a daemon thread, started; its return value lands in the dict under "result", or the exception
    it raised under "error" (so a test's assertion on the result can name it)."""
    box: dict = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test, which asserts on it
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def joined(thread: threading.Thread, box: dict, timeout_s: float) -> object:
    """The result of an `in_thread` call once it ends within `timeout_s`; its exception re-raised if it failed."""
    thread.join(timeout=timeout_s)
    assert not thread.is_alive(), f"the call did not end in {timeout_s:.0f} s"
    if "error" in box:
        raise box["error"]
    return box["result"]


def assert_no_run_processes(timeout_s: float = 20.0) -> None:
    """Nothing a test started (Ray daemons and workers, the router, engines) is still alive."""
    deadline = time.monotonic() + timeout_s
    while session_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert session_processes() == []


def kill_run_processes(run_id: str) -> list[int]:
    """SIGKILL every live process that carries TEST_RUN_VAR=`run_id`; returns their pids. A main.py killed at
    its timeout takes only what dies with it: an engine's own children (vLLM's engine core and worker, which
    keep a core busy) outlive the actor that launched the server."""
    killed = []
    for proc in _carrying(TEST_RUN_VAR, run_id):
        with contextlib.suppress(psutil.Error):  # gone meanwhile
            proc.kill()
            killed.append(proc.info["pid"])
    return killed


class TreeCpu:
    """CPU seconds (user + system) of a process and every descendant it starts, sampled every `interval_s` in a
    daemon thread while the process lives (each process counts with its last sample: a process living less than
    `interval_s`, and a process's last `interval_s`, are not counted)."""

    def __init__(self, pid: int, interval_s: float = 0.5):
        self._root, self._interval_s = pid, interval_s
        self._last: dict[tuple[int, float], float] = {}  # (pid, create time) -> its CPU seconds when last seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)
        self._thread.start()

    def _sample_until_stopped(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                root = psutil.Process(self._root)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            for proc in tree:
                with contextlib.suppress(psutil.Error):
                    times = proc.cpu_times()
                    self._last[(proc.pid, proc.create_time())] = times.user + times.system

    def stop(self) -> float:
        """Stops sampling; the CPU seconds counted."""
        self._stop.set()
        self._thread.join(timeout=5)
        return sum(self._last.values())
