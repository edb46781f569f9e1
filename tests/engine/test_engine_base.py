"""HTTPEngine lifecycle, process helpers, the engine registry and router flag conversion (fast, no model)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from slime.engine.base import ENGINES, EngineStartupError, HTTPEngine, get_engine_class
from slime.engine.hf.engine import HFEngine
from slime.engine.process import child_env, launch_process
from slime.engine.router import router_flags


class _CommandEngine(HTTPEngine):
    """An engine whose 'server' is an arbitrary command (port file ignored)."""

    def __init__(self, cmd, **kw):
        super().__init__(rank=7, host="127.0.0.1", **kw)
        self.cmd = cmd

    def _launch(self, port_file):
        return launch_process(self.cmd, log_path=self.log_path)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_registry():
    assert get_engine_class("hf") is HFEngine and ENGINES["hf"] is HFEngine
    with pytest.raises(ValueError, match="unknown rollout engine 'vllm'.*hf"):
        get_engine_class("vllm")


def test_router_flags():
    flags = router_flags({"cache_threshold": 0.3, "disable_circuit_breaker": True, "dp_aware": False,
                          "api_key": None, "worker_urls": ["http://a:1", "http://b:2"]})
    assert flags == ["--cache-threshold", "0.3", "--disable-circuit-breaker", "--worker-urls", "http://a:1", "http://b:2"]
    with pytest.raises(ValueError, match="port"):
        router_flags({"port": 5})


def test_startup_failure_raises_with_log_tail(tmp_path):
    engine = _CommandEngine([sys.executable, "-c", "import sys; print('boom: no such model'); sys.exit(3)"],
                            log_dir=str(tmp_path), startup_timeout_s=20)
    with pytest.raises(EngineStartupError, match=r"(?s)status 3.*boom: no such model"):
        engine.start()
    assert engine.process is None and (tmp_path / "engine_7.log").exists()


def test_startup_timeout_kills_the_process(tmp_path):
    engine = _CommandEngine(["sleep", "30"], log_dir=str(tmp_path), startup_timeout_s=0.5, shutdown_grace_s=2)
    engine.launch()
    pid = engine.process.pid
    with pytest.raises(EngineStartupError, match="port file"):
        engine.wait_until_ready()
    assert _gone(pid)
    engine.shutdown()  # idempotent


def test_child_dies_with_its_parent(tmp_path):
    parent_code = textwrap.dedent(f"""
        import sys, time
        from slime.engine.process import launch_process
        child = launch_process(["sleep", "60"], log_path={str(tmp_path / "child.log")!r})
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, env=child_env(), text=True)
    try:
        child_pid = int(parent.stdout.readline())
        assert not _gone(child_pid)
        assert os.getpgid(child_pid) == child_pid != os.getpgid(parent.pid)  # own session / group
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 5
        while not _gone(child_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(child_pid)
    finally:
        parent.kill()
        parent.wait()
