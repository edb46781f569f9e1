"""Live console progress: a rich progress bar over rollout steps with the latest reward and timings."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class RunProgress:
    """Shown from `begin(start)` on: the first rollout is known only once the trainers are up."""

    def __init__(self, *, total: int, enabled: bool):
        self.enabled = enabled
        self.total = total
        self.console = Console(stderr=True)
        self.progress = None

    def begin(self, start: int) -> None:
        if not self.enabled:
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

    def phase(self, text: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=text)

    def step_done(self, rollout_id: int, metrics: dict[str, float]) -> None:
        if self.progress is None:
            return
        summary = f"reward {metrics.get('rollout/raw_reward', float('nan')):.3f}"
        if "train/pg_loss" in metrics:
            summary += f"  pg_loss {metrics['train/pg_loss']:+.4f}"
        if "perf/step_time" in metrics:
            summary += f"  {metrics['perf/step_time']:.2f}s/step"
        self.progress.update(self.task, advance=1, description=summary)
        self.progress.console.print(f"rollout {rollout_id:4d}  {summary}", highlight=False)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
