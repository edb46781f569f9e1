"""EngineServer lifecycle (reserved ports, health polling, log tail), process helpers, the engine
registry, port reservation and router flag conversion (fast, no model)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from slime.engine.base import EngineStartupError, get_engine_class
from slime.engine.hf.engine import HFEngine
from slime.engine.ports import reserve_ports
from slime.engine.process import child_env
from slime.engine.router import Router, router_flags
from slime.net import reached_at
from tests.helpers.engines import CommandEngine
from tests.helpers.ports import hold_consecutive_ports

# A stand-in server: answers /health_generate with 200 after `delay` seconds, on the port it is given.
_HEALTH_SERVER = textwrap.dedent("""
    import http.server, sys, time
    port, delay = int(sys.argv[1]), float(sys.argv[2])
    host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"
    start = time.monotonic()
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/health_generate" and time.monotonic() - start > delay
            self.send_response(200 if ok else 503); self.end_headers()
        def log_message(self, *a): pass
    print("serving on", port, flush=True)
    http.server.HTTPServer((host, port), H).serve_forever()
""")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_registry():
    assert get_engine_class("hf") is HFEngine
    with pytest.raises(
        ValueError, match="unknown rollout engine 'hff' \\(did you mean hf\\?\\); registered: hf, sglang, vllm"
    ):
        get_engine_class("hff")


def test_router_flags():
    flags = router_flags(
        {
            "cache_threshold": 0.3,
            "disable_circuit_breaker": True,
            "dp_aware": False,
            "api_key": None,
            "worker_urls": ["http://a:1", "http://b:2"],
        }
    )
    assert flags == [
        "--cache-threshold",
        "0.3",
        "--disable-circuit-breaker",
        "--worker-urls",
        "http://a:1",
        "http://b:2",
    ]
    with pytest.raises(ValueError, match="port"):
        router_flags({"port": 5})


def test_reserved_ports_are_distinct_bindable_and_released(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIME_PORT_LOCK_DIR", str(tmp_path))
    first = reserve_ports("127.0.0.1", 3)
    second = reserve_ports("127.0.0.1", 3)  # the same process, another lease: never the same ports
    assert len(set(first.ports) | set(second.ports)) == 6
    assert all(15000 <= p < 32768 for p in first.ports)
    with socket.socket() as sock:  # a reserved port is free for its server to bind
        sock.bind(("127.0.0.1", first.ports[0]))
    # A port some other process holds open is never handed out.
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        held = busy.getsockname()[1]
        # the range starts at the busy port; the ports after it may be taken by others on a shared machine
        lease = reserve_ports("127.0.0.1", 1, first=held, last=held + 50)
        assert lease.ports[0] != held and held < lease.ports[0] <= held + 50
        lease.release()
    port = first.ports[0]
    with pytest.raises(RuntimeError, match="only 0 of 1 ports free"):
        reserve_ports("127.0.0.1", 1, first=port, last=port)  # still leased
    first.release()
    again = reserve_ports("127.0.0.1", 1, first=port, last=port)  # released: free again
    assert again.ports == [port]
    again.release()
    second.release()


def test_reservation_holds_across_processes(tmp_path):
    """A port leased by one process is skipped by another until that process exits."""
    env = child_env({"SLIME_PORT_LOCK_DIR": str(tmp_path)})
    code = (
        "from slime.engine.ports import reserve_ports; import sys, time; "
        "l = reserve_ports('127.0.0.1', 1, first=int(sys.argv[1]), last=int(sys.argv[1]) + 5); "
        "print(l.ports[0], flush=True); time.sleep(30)"
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        base = 20000 + probe.getsockname()[1] % 10000
    holder = subprocess.Popen([sys.executable, "-c", code, str(base)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        held = int(holder.stdout.readline())
        os.environ["SLIME_PORT_LOCK_DIR"] = str(tmp_path)
        lease = reserve_ports("127.0.0.1", 1, first=held, last=held + 5)
        assert lease.ports[0] != held
        lease.release()
    finally:
        os.environ.pop("SLIME_PORT_LOCK_DIR", None)
        holder.kill()
        holder.wait()


def test_server_gets_the_reserved_port_and_health_is_polled(tmp_path):
    engine = CommandEngine(lambda ports: [sys.executable, "-c", _HEALTH_SERVER, str(ports[0]), "0.5"], tmp_path)
    started = time.monotonic()
    url = engine.start()
    try:
        assert url == f"http://127.0.0.1:{engine.lease.ports[0]}"
        assert time.monotonic() - started >= 0.5  # 503 until then: polled, not assumed
        assert engine.client.is_healthy()
        assert f"serving on {engine.lease.ports[0]}" in (tmp_path / "engine_7.log").read_text()
    finally:
        pid = engine.pid
        engine.shutdown()
    assert _gone(pid) and engine.lease._handles == []


def test_a_server_bound_to_every_interface_is_reached_at_its_nodes_ip(tmp_path):
    """cluster.host=0.0.0.0 (several nodes): the server binds every interface and is reached, health-polled and
    registered at `EngineLaunch.node_ip` (here another loopback address, as another node's IP would be)."""
    engine = CommandEngine(
        lambda ports: [sys.executable, "-c", _HEALTH_SERVER, str(ports[0]), "0", "0.0.0.0"],
        tmp_path,
        host="0.0.0.0",
        node_ip="127.0.0.3",
    )
    url = engine.start()
    try:
        assert url == f"http://127.0.0.3:{engine.lease.ports[0]}" and engine.client.is_healthy()
    finally:
        engine.shutdown()
    assert reached_at("10.1.2.3", "10.9.9.9") == "10.1.2.3"  # a given address is where it is reached
    with pytest.raises(ValueError, match="needs its node's IP"):
        reached_at("0.0.0.0", None)


def test_startup_failure_raises_with_log_tail(tmp_path):
    engine = CommandEngine(
        lambda ports: [sys.executable, "-c", "import sys; print('boom: no such model'); sys.exit(3)"], tmp_path
    )
    with pytest.raises(EngineStartupError, match=r"(?s)status 3.*boom: no such model"):
        engine.start()
    assert engine.process is None and (tmp_path / "engine_7.log").exists()


def test_startup_timeout_kills_the_process(tmp_path):
    engine = CommandEngine(
        lambda ports: [sys.executable, "-c", _HEALTH_SERVER, str(ports[0]), "60"], tmp_path, timeout_s=1.0
    )
    engine.launch()
    pid = engine.pid
    with pytest.raises(EngineStartupError, match=r"(?s)longer than 1 s to answer GET /health_generate.*serving on"):
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


def test_free_ports_come_from_between_the_engines_range_and_the_kernels_picks(monkeypatch):
    """A rendezvous or router port is taken from 32001 up to the ephemeral range's start (read from the kernel), where
    neither an engine's reservation nor a kernel-chosen port (an outgoing connection, a port-0 listener) lands; the
    kernel's pick once that window is full. The full window is three ports this test holds (runs beside it take
    ports of the real window)."""
    from slime import net

    ephemeral = int(net.EPHEMERAL_RANGE.read_text().split()[0])
    assert all(32000 < net.free_port() < ephemeral for _ in range(20))
    held = hold_consecutive_ports(range(32001, ephemeral - 2), count=3)
    try:
        first = held[0].getsockname()[1]
        monkeypatch.setattr(net, "ENGINE_PORTS", (15000, first - 1))
        monkeypatch.setattr(net, "_ephemeral_start", lambda: first + 3)
        assert net.free_port() >= ephemeral  # the window is full: the kernel's pick
        held.pop().close()
        assert net.free_port() == first + 2
    finally:
        for busy in held:
            busy.close()


def test_a_router_describes_itself_as_engines_json_lists_it(tmp_path):
    launched = Router("http://127.0.0.1:5", subprocess.Popen(["true"]), tmp_path / "router.log")
    launched.process.wait()
    assert launched.describe() == {
        "url": "http://127.0.0.1:5",
        "pid": launched.process.pid,
        "log": str(tmp_path / "router.log"),
    }
    assert Router("http://127.0.0.1:6/").describe() == {"url": "http://127.0.0.1:6", "external": True}
