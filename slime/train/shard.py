"""`LoadedShard`: one rollout step's data on a training rank, the state every call of that step reads.

`TrainBackend.load_batch` makes one; the step's calls pass it along (`slime.train.steps`) rather than reading
attributes another class set. Columns are flat per-response-token tensors: sample i's tokens follow sample i-1's,
`batch.response_lengths[i]` of them.
"""

from __future__ import annotations

import dataclasses

import torch

from slime.algo.reduction import token_weights
from slime.train import batching
from slime.types import TrainBatch


@dataclasses.dataclass
class LoadedShard:
    """A rank's data-parallel shard of rollout `rollout_id` and the columns computed on it so far
    ("old_log_probs", "advantages", "values", ...: Tensor[total response tokens] on `device`)."""

    rollout_id: int
    batch: TrainBatch
    device: torch.device
    columns: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def flat(self, values: list[list[float]], indices: list[int]) -> torch.Tensor:
        """float32 Tensor[N]: the per-token `values` of samples `indices`, concatenated."""
        return batching.flat(values, indices, dtype=torch.float32, device=self.device)

    def pick(self, name: str, mb: list[int]) -> torch.Tensor | None:
        """Column `name`'s tokens of samples `mb`, concatenated (None when the column was not computed)."""
        return batching.pick(self.columns.get(name), batching.offsets(self.batch.response_lengths), mb)

    def weights(
        self, mb: list[int], step: int, mask: torch.Tensor, mode: str, constant_length: float | None = None
    ) -> torch.Tensor:
        """Tensor[N]: each response token's weight in optimizer step `step`'s loss (`slime.algo.reduction`),
        for micro-batch `mb` with loss mask `mask`."""
        batch = self.batch
        return token_weights(
            mask,
            [batch.response_lengths[i] for i in mb],
            mode=mode,
            num_trajectories=batch.num_trajectories_per_step[step],
            total_masked_tokens=float(batch.masked_tokens_per_step[step]),
            constant_length=constant_length,
        )
