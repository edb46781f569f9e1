"""The stack dump each Ray actor of the run arms when it starts (the rollout manager, the trainer ranks): SIGUSR1
then makes faulthandler write every thread's Python stack to `<run dir>/stacks/.armed/<pid>.txt`, where the driver's
watchdog (slime.driver.watchdog) collects it when a phase runs past its limit. The stacks directory comes through
the environment (`STACKS_ENV`), which a local Ray cluster's workers inherit from the driver.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from pathlib import Path

STACKS_ENV = "SLIME_STACKS_DIR"
DUMP_SIGNAL = signal.SIGUSR1
ARMED = ".armed"


def arm_stack_dump() -> None:
    """In an actor process: SIGUSR1 writes all threads' stacks to `$SLIME_STACKS_DIR/.armed/<pid>.txt`."""
    stacks_dir = os.environ.get(STACKS_ENV)
    if not stacks_dir:
        return
    armed = Path(stacks_dir) / ARMED
    armed.mkdir(parents=True, exist_ok=True)
    # faulthandler keeps a reference to the file and writes to its descriptor from the signal handler
    out = open(armed / f"{os.getpid()}.txt", "w")  # noqa: SIM115
    faulthandler.register(DUMP_SIGNAL, file=out, all_threads=True, chain=False)
