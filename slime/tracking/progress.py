"""Live console progress: a rich progress bar over rollout steps with the current phase and the latest reward.

On a terminal the bar shows `rollout N · <phase>` while a phase runs (generation, training, save, weight
sync, eval) and the last step's reward, loss and time after it. Elsewhere (a log file, a Ray job, CI)
it prints plain lines instead: one per finished rollout step, and one for each phase that took
`slow_phase_s` seconds or more, so a long phase is visible in the log.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

PHASE_TEXT = {
    "rollout": "generating",
    "train": "training",
    "save": "saving checkpoint",
    "weight_sync": "syncing weights",
    "eval": "evaluating",
    "startup": "starting",
    "teardown": "stopping",
}


class RunProgress:
    """Shown from `begin(start)` on: the first rollout is known only once the trainers are up."""

    def __init__(
        self,
        *,
        total: int,
        enabled: bool,
        steps_per_rollout: int = 1,
        console: Console | None = None,
        slow_phase_s: float = 10.0,
    ):
        self.enabled = enabled
        self.total = total
        self.steps_per_rollout = steps_per_rollout
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal
        self.slow_phase_s = slow_phase_s
        self.progress = None
        self._phase: tuple[str, int | None, float] | None = None

    def begin(self, start: int) -> None:
        if not self.enabled or not self.live:
            return
        self.progress = Progress(
            TextColumn("[bold]rollout"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task("starting...", total=self.total, completed=start)
        self.progress.start()

    def on_phase(self, phase: str, rollout_id: int | None) -> None:
        """The driver entered `phase` (of rollout `rollout_id`; -1 or None before the first)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if self._phase is not None and not self.live:
            name, rid, started = self._phase
            if now - started >= self.slow_phase_s:
                where = f"rollout {rid} " if rid is not None and rid >= 0 else ""
                self.console.print(f"{where}{PHASE_TEXT.get(name, name)}: {now - started:.1f}s", highlight=False)
        self._phase = (phase, rollout_id, now)
        text = PHASE_TEXT.get(phase, phase)
        if phase == "train":
            k = self.steps_per_rollout
            text += f" ({k} optimizer step{'s' * (k > 1)})"
        if rollout_id is not None and rollout_id >= 0:
            text = f"rollout {rollout_id}: {text}"
        elif phase == "weight_sync":
            text = "initial weight push"
        self.phase(text + "...")

    def phase(self, text: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=text)

    def step_done(self, rollout_id: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        summary = f"reward {metrics.get('rollout/raw_reward', float('nan')):.3f}"
        if "train/pg_loss" in metrics:
            summary += f"  pg_loss {metrics['train/pg_loss']:+.4f}"
        if "perf/step_time" in metrics:
            summary += f"  {metrics['perf/step_time']:.2f}s/step"
        if self.progress is not None:
            self.progress.update(self.task, advance=1, description=summary)
        self.console.print(f"rollout {rollout_id:4d}/{self.total}  {summary}", highlight=False)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
