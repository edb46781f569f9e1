"""Training ranks without a model, for tests of the runtime's data path (slime.driver.train_group).

Real `TrainRank` actors around `RecordingBackend`, a `TrainBackend` that keeps what it receives (its shard, its
columns) and, as a critic, computes values from its shard's samples alone. A helper module, though one test
module uses it: a Ray worker imports the module of the class it runs, and this one imports no test module (nor
conftest.py, whose import makes a session cache directory).
"""

from __future__ import annotations

from typing import Any

import ray

from slime.driver.train_group import TrainGroup, TrainRank
from slime.train.base import TrainBackend
from slime.train.layout import RankLayout


def critic_values(sample_index: int, response_length: int) -> list[float]:
    """The values `RecordingBackend` computes for one sample: index + token position / 10 per response token."""
    return [sample_index + t / 10 for t in range(response_length)]


class RecordingBackend(TrainBackend):
    """Trains nothing; `compute_advantages` sets column "returns" to values + 1 (a stand-in for GAE)."""

    def init(self) -> int:
        return 0

    def load_checkpoint(self, root: str, ckpt_step: int | None) -> int:
        return 0

    def save_checkpoint(self, rollout_id: int, root: str) -> None:
        pass

    def train(self, *, update: bool = True) -> dict[str, Any]:
        return {"steps": [], "perf": {}}

    def export_weights(self, bucket_bytes: int):
        return iter(())

    def compute_values(self) -> list[list[float]]:
        b = self.batch
        return [critic_values(i, n) for i, n in zip(b.sample_indices, b.response_lengths)]

    def compute_advantages(self) -> dict[str, float]:
        self.columns["returns"] = self.columns["values"] + 1
        return {}

    def received(self) -> dict[str, Any]:
        """What this rank holds: its rank, its shard (a TrainBatch) and its per-sample columns."""
        columns = {name: self.get_column(name) for name in self.columns}
        return {"rank": self.rank, "batch": self.batch, "columns": columns}


class RecordingRank(TrainRank):
    """`TrainRank`'s dispatch (`call`, `put_owned`) around a `RecordingBackend`."""

    def __init__(self, rank: int, layout: RankLayout):
        self.backend = RecordingBackend(None, rank=rank, layout=layout, master_addr="", master_port=0)


def recording_group(layout: RankLayout) -> TrainGroup:
    """A `TrainGroup` of `RecordingRank` actors (no CPU reserved: they idle between calls)."""
    rank_actor = ray.remote(num_cpus=0)(RecordingRank)
    return TrainGroup(layout, [rank_actor.remote(rank, layout) for rank in range(layout.world_size)])
