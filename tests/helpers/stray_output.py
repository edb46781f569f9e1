"""A run's console on a terminal while the process and a child write to file descriptors 1 and 2 behind rich's back.

`python -m tests.helpers.stray_output` (run by tests/driver/test_console.py on a pseudo-terminal): starts the live
display the run's way (`RunConsole.follow`), and at every rollout step writes a line with `os.write(2, ...)`, one with
`os.write(1, ...)` and one from a child process (`sh -c 'echo ... >&2'`), redrawing the display after each; then a
partial line on fd 1, the end summary, `close()`, and a line on fd 2 after it. Its last line counts the process's
open file descriptors and threads before the display and after close: `fds 7 -> 7, threads 1 -> 1`.
"""

from __future__ import annotations

import os
import subprocess
import threading

from slime.config.schema import LoggerConfig
from slime.driver.console import RunConsole
from slime.driver.events import EventBus, RunEvent

STEPS = 3


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> None:
    fds, threads = open_fds(), threading.active_count()
    console = RunConsole(LoggerConfig(), total=STEPS)
    events = EventBus()
    console.follow(events)
    display = console.progress.display
    assert display is not None, "no live display: not a terminal?"
    try:
        for step in range(STEPS):
            events.publish(RunEvent.PHASE_STARTED, step, phase="rollout", started=0.0)
            display.refresh()
            os.write(2, f"fd 2 in rollout {step}\n".encode())
            display.refresh()
            os.write(1, f"fd 1 in rollout {step}\n".encode())
            display.refresh()
            subprocess.run(["sh", "-c", f"echo a child in rollout {step} >&2"], check=True)
            display.refresh()
            events.publish(RunEvent.STEP_DONE, step, metrics={"rollout/raw_reward": 0.5, "perf/step_time": 1.0})
            display.refresh()
        os.write(1, b"a partial line")
        console.finish("=== summary ===", outcome="done")
    finally:
        console.close()
    os.write(2, b"fd 2 after close\n")
    print(f"fds {fds} -> {open_fds()}, threads {threads} -> {threading.active_count()}", flush=True)


if __name__ == "__main__":
    main()
