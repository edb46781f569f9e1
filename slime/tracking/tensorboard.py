"""TensorBoard as a second sink (`logger.tensorboard=true`, `pip install .[tensorboard]`).

Event files go to `<run dir>/tensorboard/`, so `tensorboard --logdir outputs/` shows every run. Each
scalar keeps its wandb name and is plotted against its own step axis (`train/*` against train/step,
`eval/*` against eval/step, everything else against rollout/step), the axes wandb declares. Written
with TensorBoard's own event writer: no TensorFlow, no torch. An optional library: the tracker imports this module
only when `logger.tensorboard=true` (a missing package is a config error at start-up, slime.tracking.check).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from slime.tracking.step_axes import STEP_AXES, axis_of


class TensorBoardSink:
    def __init__(self, run_dir: Path):
        self.log_dir = Path(run_dir) / "tensorboard"
        self._writer = EventFileWriter(str(self.log_dir))

    def log(self, record: dict[str, float]) -> None:
        """One event (metrics plus their step axes, as written to metrics.jsonl)."""
        axes = set(STEP_AXES.values())
        by_step: dict[int, list] = {}
        for key, value in record.items():
            axis = axis_of(key)
            if key in axes or axis not in record or not isinstance(value, int | float) or not math.isfinite(value):
                continue
            by_step.setdefault(int(record[axis]), []).append(Summary.Value(tag=key, simple_value=float(value)))
        now = time.time()
        for step, values in by_step.items():
            self._writer.add_event(Event(wall_time=now, step=step, summary=Summary(value=values)))

    def close(self) -> None:
        self._writer.close()
