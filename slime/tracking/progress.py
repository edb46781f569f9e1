"""Live console progress: a rich progress bar over rollout steps with the current phase and the latest reward.

On a terminal the bar shows `rollout N · <phase>` while a phase runs (generation, training, save, weight
sync, eval) and the last step's reward, loss and time after it; while a rollout generates, a second bar
counts its groups (kept of `rollout.batch_size`, with the groups drawn by over-sampling, still in flight
and dropped by the dynamic filter). Elsewhere (a log file, a Ray job, CI) it prints plain lines instead:
one per finished rollout step, one for each phase that took `slow_phase_s` seconds or more, and the
group counts every `slow_phase_s` seconds while generating (and once at its end when it was that slow),
so a long phase is visible in the log.
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
        self._groups_printed = float("-inf")  # when the last plain line of group counts was printed

    @property
    def poll_s(self) -> float | None:
        """How often the driver should fetch the rollout's group counts (None: not shown)."""
        if not self.enabled:
            return None
        return 0.5 if self.live else max(self.slow_phase_s, 0.1)

    def begin(self, start: int) -> None:
        if not self.enabled or not self.live:
            return
        self.progress = Progress(
            TextColumn("[bold]{task.fields[label]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task("starting...", total=self.total, completed=start, label="rollout")
        self.groups_task = self.progress.add_task("", total=1, visible=False, label=" groups")
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
        if self.progress is not None:  # the group bar belongs to the generation phase
            self.progress.update(self.groups_task, visible=False, completed=0)
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

    def rollout_groups(self, rollout_id: int, counts: dict[str, int], *, final: bool = False) -> None:
        """Group counts of rollout `rollout_id` so far (`slime.rollout.base.RolloutProgress` fields); `final`:
        generation ended (the groups still in flight were cut and go back to the data source)."""
        if not self.enabled or not counts["needed"]:  # a rollout function that reports no counts (e.g. sft)
            return
        detail = f"{counts['submitted']} drawn, {counts['in_flight']} {'cut' if final else 'in flight'}"
        detail += f", {counts['dropped']} filtered"
        if self.progress is not None:
            self.progress.update(
                self.groups_task, total=counts["needed"], completed=counts["kept"], description=detail, visible=True
            )
            return
        now = time.monotonic()
        started = self._phase[2] if self._phase is not None else now
        # while generating: a line every slow_phase_s; at the end: one if generation was slow
        if now - (started if final else self._groups_printed) >= self.slow_phase_s:
            self._groups_printed = now
            line = f"rollout {rollout_id}: {counts['kept']}/{counts['needed']} groups kept, {detail}"
            self.console.print(line, highlight=False)

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
