"""The run's console (slime/driver/console.py): which log records reach the terminal and which stream, main.log,
the workers' lines, and a warning printed above the live display instead of across it (on a real pseudo-terminal),
as is what the process and its children write to file descriptors 1 and 2 meanwhile.
"""

from __future__ import annotations

import io
import logging
import os
import pty
import re
import sys
import threading
import warnings

import pytest

from slime.config.schema import LoggerConfig
from slime.driver.console import RunConsole
from slime.driver.events import EventBus, RunEvent
from slime.driver.ray_session import _ray_records_to_root
from tests.helpers.compose import ROOT
from tests.helpers.runs import assert_stopped_in_validation, run_main
from tests.helpers.terminal import Screen, run_in_terminal

HF_BARS = "HF_HUB_DISABLE_PROGRESS_BARS"


@pytest.fixture(autouse=True)
def plain_terminal_environment(monkeypatch):
    """rich reads the terminal from TERM and these overrides: a tty is a terminal here, and only a tty."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")


@pytest.fixture
def streams():
    return io.StringIO(), io.StringIO()


def opened(tmp_path, streams, **logger) -> RunConsole:
    stdout, stderr = streams
    console = RunConsole(LoggerConfig(**logger), total=3, stdout=stdout, stderr=stderr)
    logging.getLogger().setLevel(logging.INFO)
    return console.open(tmp_path)


def test_plain_keeps_infos_and_library_warnings_in_main_log(tmp_path, streams, monkeypatch):
    monkeypatch.delenv(HF_BARS, raising=False)
    stdout, stderr = streams
    console = opened(tmp_path, streams)
    try:
        assert os.environ[HF_BARS] == "1" and console.worker_env == {HF_BARS: "1"}
        logging.getLogger("slime.driver.driver").info("phase rollout (rollout 0) started")
        logging.getLogger("slime.driver.driver").warning("rollout manager shutdown failed: gone")
        logging.getLogger("a_library.loader").warning("Some weights were not initialized")
        logging.getLogger("urllib3").error("connection refused")
        warnings.warn("a library's deprecation", DeprecationWarning, stacklevel=1)
        console.report("rollout    0/3  reward 0.250")
    finally:
        console.close()
    assert stdout.getvalue() == "rollout    0/3  reward 0.250\n"
    assert stderr.getvalue().splitlines() == [
        "WARNING slime.driver.driver: rollout manager shutdown failed: gone",
        "ERROR urllib3: connection refused",
    ]
    log = (tmp_path / "main.log").read_text()
    for text in ("[INFO] - phase rollout (rollout 0) started", "Some weights were not", "a library's deprecation"):
        assert text in log
    assert HF_BARS not in os.environ  # put back as it was


def test_verbose_prints_every_record_on_stderr_and_keeps_the_hf_bars(tmp_path, streams, monkeypatch):
    monkeypatch.delenv(HF_BARS, raising=False)
    stdout, stderr = streams
    console = opened(tmp_path, streams, console="verbose")
    try:
        assert HF_BARS not in os.environ and console.worker_env == {}
        logging.getLogger("slime.driver.driver").info("phase startup started")
        logging.getLogger("urllib3").warning("Retrying the connection")
    finally:
        console.close()
    assert stdout.getvalue() == ""
    lines = stderr.getvalue().splitlines()
    assert [line.split("]", 1)[1] for line in lines] == [
        "[slime.driver.driver][INFO] - phase startup started",
        "[urllib3][WARNING] - Retrying the connection",
    ]


def test_rays_records_reach_the_root_handlers_only_while_a_console_runs_the_session():
    """`import ray` gives Ray's logger its own stderr handler and stops its propagation; a session with a worker
    output (the console's) hands Ray's records to the root (main.log and the terminal's rule), and gives them back."""
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger().addHandler(handler)
    ray_logger = logging.getLogger("ray")
    own = list(ray_logger.handlers)
    try:
        assert not ray_logger.propagate and own  # as `import ray` left it
        with _ray_records_to_root(True):
            assert ray_logger.handlers == [] and ray_logger.propagate
            logging.getLogger("ray._private.authentication").warning("Token authentication is enabled")
        with _ray_records_to_root(False):
            assert ray_logger.handlers == own
        assert ray_logger.handlers == own and not ray_logger.propagate
    finally:
        logging.getLogger().removeHandler(handler)
    assert seen == ["Token authentication is enabled"]


def test_the_console_takes_hydras_terminal_handler_off_for_the_run_and_puts_it_back(tmp_path, streams):
    root = logging.getLogger()
    hydras = logging.StreamHandler(sys.stdout)  # what hydra/hydra_logging puts on the root
    root.addHandler(hydras)
    try:
        console = opened(tmp_path, streams)
        assert hydras not in root.handlers
        console.close()
        assert hydras in root.handlers
        assert not [h for h in root.handlers if getattr(h, "baseFilename", "").endswith("main.log")]
    finally:
        root.removeHandler(hydras)


def test_worker_lines_go_to_logs_workers_log_and_on_verbose_to_stderr(tmp_path, streams):
    stdout, stderr = streams
    for mode in ("plain", "verbose"):
        run_dir = tmp_path / mode
        run_dir.mkdir()
        console = opened(run_dir, streams, console=mode)
        try:
            console.worker_output({"pid": 812, "actor_name": "FSDPBackend(rank=0)", "lines": ["Loading weights"]})
            console.worker_output({"pid": 813, "task_name": "", "lines": ["a", "b"], "is_err": True})
            console.worker_output({"pid": "raylet", "lines": ["A worker died"]})
        finally:
            console.close()
        assert (run_dir / "logs" / "workers.log").read_text().splitlines() == [
            "(FSDPBackend(rank=0) pid=812) Loading weights",
            "(pid=813) a",
            "(pid=813) b",
            "(raylet) A worker died",
        ]
    assert stdout.getvalue() == ""
    assert stderr.getvalue().splitlines() == (run_dir / "logs" / "workers.log").read_text().splitlines()  # verbose


def test_off_a_terminal_no_display_and_one_line_per_rollout_step(tmp_path, streams):
    stdout, _ = streams
    console = opened(tmp_path, streams)
    events = EventBus()
    try:
        console.follow(events)
        assert not console.progress.showing and console.group_poll_s == 10.0
        events.publish(RunEvent.PHASE_STARTED, None, phase="startup", started=0.0)
        events.publish(RunEvent.LOOP_STARTED, start=0, trainer=None)
        for step in range(3):
            events.publish(RunEvent.PHASE_STARTED, step, phase="rollout", started=0.0)
            events.publish(RunEvent.STEP_DONE, step, metrics={"rollout/raw_reward": 0.5, "perf/step_time": 1.0})
        console.finish("=== summary ===", outcome="done")
    finally:
        console.close()
    assert stdout.getvalue().splitlines() == [
        "rollout    0/3  reward 0.500  1.00s/step",
        "rollout    1/3  reward 0.500  1.00s/step",
        "rollout    2/3  reward 0.500  1.00s/step",
        "=== summary ===",
    ]
    events.publish(RunEvent.STEP_DONE, 3, metrics={})  # closed: no longer followed
    assert stdout.getvalue().count("\n") == 4


def test_on_a_terminal_a_warning_goes_above_the_live_display(tmp_path):
    """stdout and stderr on one pseudo-terminal, as in a shell: the display is drawn, the warning and a stray write
    to sys.stderr are printed above it, and no terminal line holds both the bar and either of them."""
    master, slave = pty.openpty()
    terminal = os.fdopen(slave, "w", buffering=1)
    written = bytearray()
    reader = threading.Thread(target=_drain, args=(master, written), daemon=True)
    reader.start()
    console = RunConsole(LoggerConfig(), total=3, stdout=terminal, stderr=terminal)
    events = EventBus()
    try:
        console.open(tmp_path)
        console.follow(events)
        assert console.progress.showing and console.group_poll_s == 0.5
        events.publish(RunEvent.PHASE_STARTED, 0, phase="rollout", started=0.0)
        console.progress.display.refresh()
        logging.getLogger("slime.rollout").warning("2 of 32 groups dropped by the filter")
        print("a stray line of a library", file=sys.stderr)
        events.publish(RunEvent.STEP_DONE, 0, metrics={"rollout/raw_reward": 0.25, "perf/step_time": 1.5})
        console.progress.display.refresh()
        console.finish("=== summary ===", outcome="done")
    finally:
        console.close()
        terminal.close()
        reader.join(timeout=10)
    lines = Screen(bytes(written)).lines
    bars = [line for line in lines if "━" in line]
    assert bars and all("WARNING" not in line and "stray" not in line for line in bars), lines
    assert "WARNING slime.rollout: 2 of 32 groups dropped by the filter" in lines
    assert "a stray line of a library" in lines
    assert "rollout    0/3  reward 0.250  1.50s/step" in lines
    assert lines.index("=== summary ===") > lines.index(bars[-1])  # the summary under the display's last frame
    assert bars[-1].startswith("rollout ") and bars[-1].endswith(" done")


def test_on_a_terminal_what_the_process_and_its_children_write_to_fds_1_and_2_goes_above_the_live_display():
    """C-level writes of the driver (Ray's core worker logs to fd 2) and a child's output reach the terminal behind
    rich's back: each would leave a stale frame of the display on it. tests/helpers/stray_output.py writes such lines
    while the display is drawn: one bar stays (the last frame), each line is printed once above it, a partial line
    too, and after close fd 2 is the terminal again, with no descriptor or thread left over."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    argv = [sys.executable, "-m", "tests.helpers.stray_output"]
    code, raw = run_in_terminal(argv, cwd=ROOT, env=env, columns=120, rows=40, timeout=120)
    lines = Screen(raw, columns=120).lines
    assert code == 0, lines
    bars = [line for line in lines if "━" in line]
    assert len(bars) == 1 and re.fullmatch(r"rollout ━+ 3/3 \d+:\d\d:\d\d done", bars[0]), lines
    stray = [f"{where} in rollout {step}" for step in range(3) for where in ("fd 2", "fd 1", "a child")]
    above = lines[: lines.index(bars[0])]
    assert [line for line in above if line in stray] == stray, lines  # each once, in the order written
    assert "a partial line" in above
    assert lines[lines.index(bars[0]) + 1 :][:3] == [
        "last step: rollout 2  reward 0.500  1.00s/step",
        "=== summary ===",
        "fd 2 after close",
    ]
    counts = re.fullmatch(r"fds (\d+) -> (\d+), threads (\d+) -> (\d+)", lines[lines.index("fd 2 after close") + 1])
    assert counts and counts[1] == counts[2] and counts[3] == counts[4], lines


def test_a_console_mode_that_does_not_exist_stops_in_validation(tmp_path):
    proc, imported = run_main("logger.console=loud", f"hydra.run.dir={tmp_path / 'run'}")
    assert_stopped_in_validation(proc, imported)
    assert "logger.console='loud': must be one of ['plain', 'verbose']" in proc.stderr
    assert not (tmp_path / "run" / "main.log").exists()  # Hydra writes no log: none before the config is valid


def _drain(fd: int, into: bytearray) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the slave side is closed
            break
        if not chunk:
            break
        into += chunk
    os.close(fd)
