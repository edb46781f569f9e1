"""The run's progress on the console: one line per finished rollout step, and on a terminal a live display.

Every finished rollout step prints one line on the report console (stdout: slime/driver/console.py):

    rollout   12/60  reward 0.277  pg_loss -0.0104  1.26s/step

On a terminal (and `logger.progress=true`) a rich live display sits below those lines from the start of the run to
its end: a bar over the rollout steps with the phase under way (`rollout 12: training (2 optimizer steps)...`), while
a rollout generates a second bar of its groups (kept of `rollout.batch_size`, with the groups drawn by over-sampling,
still in flight and dropped by the dynamic filter), and the last step's figures. Anything else printed meanwhile goes
above it (rich's Live), and so does what the process and its children write to file descriptors 1 and 2 behind
Python's back (slime/tracking/fd_capture.py). Off a terminal there is no display: the step lines alone; the phases
that took `logger.progress_every_s` or more and the group counts of a long rollout go to the log
(`<run dir>/main.log`) as records of the `slime.tracking.progress` logger.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterable

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from slime.tracking.fd_capture import FdCapture

logger = logging.getLogger("slime.tracking.progress")

PHASE_TEXT = {
    "prepare": "preparing the model and data",
    "startup": "starting Ray, the engines and the trainers",
    "rollout": "generating",
    "log_probs": "log-probs and advantages",
    "train": "training",
    "save": "saving checkpoint",
    "weight_sync": "syncing weights",
    "eval": "evaluating",
    "teardown": "stopping",
}


def step_figures(metrics: dict[str, float]) -> str:
    """'reward 0.277  pg_loss -0.0104  1.26s/step' (the figures the step has)."""
    reward = metrics.get("rollout/raw_reward", math.nan)
    figures = f"reward {reward:.3f}"
    if "train/pg_loss" in metrics:
        figures += f"  pg_loss {metrics['train/pg_loss']:+.4f}"
    if "perf/step_time" in metrics:
        figures += f"  {metrics['perf/step_time']:.2f}s/step"
    return figures


class _Display(Progress):
    """rich's Progress with a line of the last step's figures under its bars."""

    last_step = ""

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.last_step:
            yield Text(self.last_step, style="dim")


class RunProgress:
    """Step lines on `console`; with `live`, the display from `start()` until `close()`.

    `total`: the run's last rollout step + 1; `slow_phase_s`: off a terminal, a phase at least this long gets a
    log record; `groups`: fetch and show the rollout's group counts (`poll_s`)."""

    def __init__(
        self,
        *,
        total: int,
        console: Console,
        live: bool,
        groups: bool = True,
        steps_per_rollout: int = 1,
        slow_phase_s: float = 10.0,
    ):
        self.total = total
        self.console = console
        self.live = live
        self.groups = groups
        self.steps_per_rollout = steps_per_rollout
        self.slow_phase_s = slow_phase_s
        self.display: _Display | None = None
        self._fds: FdCapture | None = None
        self._phase: tuple[str, int | None, float] | None = None
        self._groups_logged = float("-inf")  # when the last record of group counts was logged

    @property
    def poll_s(self) -> float | None:
        """How often the driver should fetch the rollout's group counts (None: never)."""
        if not self.groups:
            return None
        return 0.5 if self.live else max(self.slow_phase_s, 0.1)

    def start(self, *, redirect_stderr: bool = True) -> None:
        """Show the live display (on a terminal): from here on, what is printed goes above it."""
        if not self.live or self.display is not None:
            return
        self.display = _Display(
            TextColumn("[bold]{task.fields[label]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            transient=False,
            redirect_stderr=redirect_stderr,
        )
        self.task = self.display.add_task("starting...", total=self.total, completed=0, label="rollout")
        self.groups_task = self.display.add_task("", total=1, visible=False, label=" groups")
        self._fds = FdCapture(self.console, stderr=redirect_stderr)
        self._fds.start()
        self.display.start()

    @property
    def showing(self) -> bool:
        """The live display is drawn (print through `self.console` to go above it)."""
        return self.display is not None

    def begin(self, start: int) -> None:
        """The loop starts at rollout step `start` (a resumed run's first step is past 0)."""
        if self.display is not None:
            self.display.update(self.task, completed=start)

    def on_phase(self, phase: str, rollout_id: int | None) -> None:
        """The driver entered `phase` (of rollout `rollout_id`; -1 or None before the first)."""
        now = time.monotonic()
        if self._phase is not None and not self.live:
            name, rid, started = self._phase
            if now - started >= self.slow_phase_s:
                where = f"rollout {rid} " if rid is not None and rid >= 0 else ""
                logger.info("%s%s took %.1fs", where, PHASE_TEXT.get(name, name), now - started)
        self._phase = (phase, rollout_id, now)
        if self.display is None:
            return
        self.display.update(self.groups_task, visible=False, completed=0)  # the group bar belongs to generation
        text = PHASE_TEXT.get(phase, phase)
        if phase == "train":
            k = self.steps_per_rollout
            text += f" ({k} optimizer step{'s' * (k > 1)})"
        if rollout_id is not None and rollout_id >= 0:
            text = f"rollout {rollout_id}: {text}"
        elif phase == "weight_sync":
            text = "initial weight push"
        self.display.update(self.task, description=text + "...")

    def rollout_groups(self, rollout_id: int, counts: dict[str, int], *, final: bool = False) -> None:
        """Group counts of rollout `rollout_id` so far (`slime.rollout.base.RolloutProgress` fields); `final`:
        generation ended (the groups still in flight were cut and go back to the data source)."""
        if not counts["needed"]:  # a rollout function that reports no counts (e.g. sft)
            return
        detail = f"{counts['submitted']} drawn, {counts['in_flight']} {'cut' if final else 'in flight'}"
        detail += f", {counts['dropped']} filtered"
        if self.display is not None:
            self.display.update(
                self.groups_task, total=counts["needed"], completed=counts["kept"], description=detail, visible=True
            )
            return
        now = time.monotonic()
        started = self._phase[2] if self._phase is not None else now
        # while generating: a record every slow_phase_s; at the end: one if generation was slow
        if now - (started if final else self._groups_logged) >= self.slow_phase_s:
            self._groups_logged = now
            logger.info("rollout %d: %d/%d groups kept, %s", rollout_id, counts["kept"], counts["needed"], detail)

    def step_done(self, rollout_id: int, metrics: dict[str, float]) -> None:
        """The step's line (above the display on a terminal); the display counts it and shows its figures."""
        figures = step_figures(metrics)
        if self.display is not None:
            self.display.update(self.task, advance=1)
            self.display.last_step = f"last step: rollout {rollout_id}  {figures}"
        self.console.print(f"rollout {rollout_id:4d}/{self.total}  {figures}", highlight=False, soft_wrap=True)

    def eval_done(self, eval_step: int, metrics: dict[str, float]) -> None:
        """An eval's means (`eval/<name>`) go to the log, and on the display beside the last step."""
        means = {k: v for k, v in metrics.items() if k.count("/") == 1 and "-" not in k and k != "eval/step"}
        if not means:
            return
        text = ", ".join(f"{k} {v:.4f}" for k, v in sorted(means.items())[:4])
        logger.info("eval after %d rollout steps: %s", eval_step, text)
        if self.display is not None:
            self.display.last_step = f"{self.display.last_step.split('  |  ')[0]}  |  eval {text}"

    def close(self, outcome: str | None = None) -> None:
        """Stop the display (its last frame stays on the terminal, saying `outcome` when given)."""
        if self.display is not None:
            if outcome is not None:
                self.display.update(self.task, description=outcome)
            with contextlib.ExitStack() as then:  # even if one of them fails or is interrupted
                then.callback(self._fds.close)
                then.callback(self.display.stop)
                self._fds.restore()  # what fds 1 and 2 got meanwhile goes above the last frame
            self.display, self._fds = None, None
