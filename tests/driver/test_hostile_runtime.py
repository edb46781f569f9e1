"""Hostile runtime conditions: an unreachable router, engines that die or find their port taken on start,
a full disk and SIGTERM during a checkpoint save (the previous checkpoint survives and loads)."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from slime.config.resume import tracked_iteration
from slime.driver.interrupts import Interrupts, RunInterrupted
from slime.engine.base import EngineStartupError
from slime.engine.router import Router, RouterError
from slime.train.checkpoint_files import CheckpointDiskFull
from slime.train.fsdp.checkpoint import TRACKER, iter_dir
from tests.helpers.compose import ROOT
from tests.helpers.engines import CommandEngine
from tests.helpers.fsdp_rank import batches_for, make_backend, make_samples, make_setup, train_rollout
from tests.helpers.small_disk import on_small_disk
from tests.helpers.validation import snapshot


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_router_names_the_address_and_the_fix():
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(RouterError) as info:
        Router.connect(address)
    message = str(info.value)
    assert message.startswith(f"rollout.router.address={address}: the router does not answer (GET http://{address}")
    assert "connection failed" in message and "rollout.router.address=null" in message


def test_engine_killed_during_startup_reports_status_and_log(tmp_path):
    """As the OOM killer would: SIGKILL after the server printed its first lines."""
    script = "import os, signal; print('loading weights', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    engine = CommandEngine(lambda ports: [sys.executable, "-c", script], tmp_path)
    with pytest.raises(EngineStartupError) as info:
        engine.start()
    message = str(info.value)
    assert "engine 7 exited with status -9 before becoming healthy" in message and "loading weights" in message
    assert not engine.is_running()


def test_engine_whose_port_was_taken_reports_the_bind_error(tmp_path):
    """Another process takes the port between reservation and the server's bind (ports.py's window)."""
    server = textwrap.dedent("""
        import http.server, sys
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.BaseHTTPRequestHandler).serve_forever()
    """)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        engine = CommandEngine(lambda ports: [sys.executable, "-c", server, str(taken)], tmp_path)
        with pytest.raises(EngineStartupError) as info:
            engine.start()
    assert "exited with status 1" in str(info.value) and "Address already in use" in str(info.value)


@pytest.fixture
def saved_once(tiny_model_dir, tmp_path):
    """A backend with a checkpoint of rollout 0 under tmp_path/ckpt, trained one more step since."""
    root = tmp_path / "ckpt"
    backend = make_backend(make_setup(tiny_model_dir, ["train.lr=1e-2"]))
    batch = batches_for(make_samples(8, seed=0), dp=1, k=1)[0]
    train_rollout(backend, batch, rollout_id=0)
    backend.save_checkpoint(0, str(root))
    train_rollout(backend, batch, rollout_id=1)
    yield backend, root
    backend.shutdown()


def assert_previous_checkpoint_intact(root, before: dict[str, str]) -> None:
    assert tracked_iteration(str(root)) == 0 and not iter_dir(root, 1).exists()
    assert {k: v for k, v in snapshot(root).items() if k.startswith(("iter_0000000", TRACKER))} == before


def test_disk_full_during_save_keeps_the_previous_checkpoint(saved_once, monkeypatch):
    backend, root = saved_once
    before = snapshot(root)
    real_save = torch.save

    def full_disk(obj, path, *args, **kwargs):
        if str(path).endswith("optimizer.pt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointDiskFull) as info:
        backend.save_checkpoint(1, str(root))
    message = str(info.value)
    assert info.value.errno == errno.ENOSPC and ".iter_0000001.partial/optimizer.pt" in message
    previous_mib = sum(p.stat().st_size for p in iter_dir(root, 0).rglob("*") if p.is_file()) / 2**20
    assert f"checkpoint save to {iter_dir(root, 1)}: the disk is full" in message
    assert f"a checkpoint needs about {previous_mib:,.0f} MiB there" in message
    assert "iteration 0 stays the newest checkpoint" in message
    assert not (root / ".iter_0000001.partial").exists()  # the staged files are removed: the space is given back
    assert_previous_checkpoint_intact(root, before)


def test_sigterm_during_save_interrupts_it_and_keeps_the_previous_checkpoint(saved_once, monkeypatch):
    backend, root = saved_once
    before = snapshot(root)
    real_save = torch.save

    def signalled(obj, path, *args, **kwargs):
        if str(path).endswith("optimizer.pt"):
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the optimizer state is being written
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", signalled)
    with Interrupts(on_force=lambda signum: None), pytest.raises(RunInterrupted) as info:
        backend.save_checkpoint(1, str(root))
    assert info.value.exit_code == 143
    assert_previous_checkpoint_intact(root, before)


FILL_SMALL_DISK = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import torch
    from slime.train.checkpoint_files import save_state_files
    from slime.tracking import continuity
    root = Path(sys.argv[1])
    (root / "rollout").mkdir()
    save_state_files(root, 0, {"rng_0.pt": torch.zeros(16)})
    try:
        save_state_files(root, 1, {"global_dataset_state_dict_1.pt": torch.zeros(64 * 1024)})
    except Exception as exc:
        print(type(exc).__name__, exc)
    try:
        continuity.stage(root, 1, [{"note": "x" * 256 * 1024}], run_dir=root)
    except OSError as exc:
        print("stage", exc.errno)
    """
)


def test_the_data_sources_state_on_a_full_disk_names_the_save_and_leaves_no_partial_file(tmp_path):
    """On a real 128 KiB disk (tests/helpers/small_disk.py): the rollout manager's state files of a save that does not
    fit raise CheckpointDiskFull naming the save and the free space, with no partial file left; so do the staged
    records, which leave no temporary file."""
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    argv = [sys.executable, "-c", FILL_SMALL_DISK, str(disk)]
    proc = subprocess.run(on_small_disk(argv, disk, 128 * 1024, kept), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = proc.stdout.splitlines()
    assert first.startswith(f"CheckpointDiskFull [Errno 28] checkpoint save to {disk}/iter_0000001: the disk is full")
    assert "no checkpoint saved" in first
    assert second == f"stage {errno.ENOSPC}"
    assert sorted(p.name for p in (kept / "rollout").iterdir()) == ["rng_0.pt"]
    assert not list((kept / "tracking").glob("*.tmp"))
