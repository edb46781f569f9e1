"""Ctrl-C and SIGTERM: the handler policy (slime.driver.interrupts) in a bare process; real runs signalled in
every phase are in tests/e2e/test_interrupts.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.helpers.compose import ROOT

POLICY_SCRIPT = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from pathlib import Path
    from slime.driver.interrupts import Interrupts, RunInterrupted

    out = Path(sys.argv[1])
    # Started the way a shell starts a background job: SIGINT ignored. The run must still hear it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with Interrupts(on_force=lambda signum: (out / "forced").write_text(str(signum))) as interrupts:
        try:
            try:
                os.kill(os.getpid(), int(sys.argv[2]))
                time.sleep(5)
            except RunInterrupted:
                raise KeyboardInterrupt  # what ray.get raises when a signal cuts its wait
        except KeyboardInterrupt as exc:
            (out / "first").write_text(str(interrupts.interrupted(exc).exit_code))
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        (out / "child").write_text(str(child.pid))
        interrupts.begin_teardown()
        (out / "tearing_down").write_text("")
        time.sleep(60)  # a "teardown" that would hang: the second signal must cut it short
""")


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_first_signal_interrupts_second_forces_and_kills_children(sig, code, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", POLICY_SCRIPT, str(tmp_path), str(int(sig))], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not (tmp_path / "tearing_down").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, "the first signal killed the process instead of raising RunInterrupted"
        time.sleep(0.05)
    assert (tmp_path / "first").read_text() == str(code)
    child = int((tmp_path / "child").read_text())
    assert psutil.pid_exists(child)
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == code
    assert (tmp_path / "forced").read_text() == str(int(sig))
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


SIGNAL_IN_A_LOG_WRITE_SCRIPT = textwrap.dedent("""
    import io, logging, os, signal, sys, time
    from pathlib import Path
    from slime.driver.interrupts import Interrupts

    out = Path(sys.argv[1])

    class SignalledFile(io.RawIOBase):
        \"\"\"A log file whose first write is where the second Ctrl-C lands: the io.BufferedWriter above it is busy
        flushing, so a flush from the signal handler is a reentrant call it refuses.\"\"\"

        def __init__(self, path):
            self.file, self.signalled = open(path, "ab"), False

        def writable(self):
            return True

        def write(self, data):
            if not self.signalled:
                self.signalled = True
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs here
            return self.file.write(data)

    stream = io.TextIOWrapper(io.BufferedWriter(SignalledFile(out / "main.log")), write_through=True)
    logging.getLogger().addHandler(logging.StreamHandler(stream))
    with Interrupts(on_force=lambda signum: (out / "forced").write_text(str(signum))) as interrupts:
        interrupts.begin_teardown()
        logging.getLogger("run").warning("phase rollout done")
        (out / "went_on").write_text("")
        sys.exit(3)
""")


def test_a_second_signal_inside_a_log_write_still_forces_the_exit(tmp_path):
    """The forced exit flushes the log handlers; one of them is the stream the signal interrupted, which refuses
    the reentrant flush. The exit must still be 130, not an error the interrupted logging call swallows (after
    which the teardown went on and the run ended as failed)."""
    proc = subprocess.run(
        [sys.executable, "-c", SIGNAL_IN_A_LOG_WRITE_SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 130, proc.stderr
    assert (tmp_path / "forced").read_text() == str(int(signal.SIGINT)) and not (tmp_path / "went_on").exists()
