"""What every backend's actor and critic do the same way on a loaded shard, whatever the model code:
token weights, flat columns, advantages and their `rollout/*` means, and the per-micro-batch actor and
critic losses from `slime.algo`.

Mixins over `TrainBackend`: a backend supplies `self.device` and `_all_reduce(tensor)` (sum over the
data-parallel ranks) and calls these with its own forward's outputs.
"""

from __future__ import annotations

import torch

from slime.algo.advantages import reverse_kl
from slime.algo.reduction import reduce, token_weights
from slime.algo.value_loss import clipped_value_loss
from slime.train import batching
from slime.train.actor_loss import actor_loss
from slime.train.throughput import peak_gib, shard_train_flops, train_rates
from slime.train.token_advantages import compute_advantages
from slime.types import TrainBatch

LOG_PROB_COLUMNS = {"old": "old_log_probs", "ref": "ref_log_probs", "teacher": "teacher_log_probs"}
# what loads each frozen model (`TrainSetup.frozen_checkpoints`), for the error when one is asked for but absent
FROZEN_KEYS = {"ref": "checkpoint.ref_load", "teacher": "model@teacher with algo.use_opd"}


def log_probs_phase(which: str) -> str:
    """The name of `compute_log_probs(which)` in `perf/*` keys: log_probs for the policy's own, else <which>_log_probs."""
    return "log_probs" if which == "old" else f"{which}_log_probs"


class BatchColumns:
    """Token weights and flat per-token columns of the loaded shard."""

    def _weights(
        self,
        batch: TrainBatch,
        mb: list[int],
        step: int,
        mask: torch.Tensor,
        mode: str,
        constant_length: float | None = None,
    ) -> torch.Tensor:
        return token_weights(
            mask,
            [batch.response_lengths[i] for i in mb],
            mode=mode,
            num_trajectories=batch.num_trajectories_per_step[step],
            total_masked_tokens=float(batch.masked_tokens_per_step[step]),
            constant_length=constant_length,
        )

    def _flat(self, values, indices: list[int]) -> torch.Tensor:
        return batching.flat(values, indices, dtype=torch.float32, device=self.device)

    def _pick(self, name: str, mb: list[int]) -> torch.Tensor | None:
        return batching.pick(self.columns.get(name), batching.offsets(self.batch.response_lengths), mb)


class ActorSteps(BatchColumns):
    """Advantages and the actor's micro-batch loss."""

    def compute_advantages(self) -> dict[str, float]:
        s, batch, columns = self.setup, self.batch, self.columns
        everything = list(range(len(batch)))
        mask = self._flat(batch.loss_masks, everything)
        if batch.rollout_log_probs is not None:
            columns["rollout_log_probs"] = self._flat(batch.rollout_log_probs, everything)
        if s.algo.use_tis and "rollout_log_probs" not in columns:
            raise ValueError("algo.use_tis needs engine log-probs on every sample; the rollout produced none")
        if s.algo.use_rollout_logprobs:
            columns["old_log_probs"] = columns["rollout_log_probs"]
        advantages, returns, kl = compute_advantages(
            s.algo,
            rewards=torch.tensor(batch.rewards, dtype=torch.float32, device=self.device),
            response_lengths=batch.response_lengths,
            loss_mask=mask,
            old_log_probs=columns.get("old_log_probs"),
            ref_log_probs=columns.get("ref_log_probs"),
            values=columns.get("values"),
            all_reduce=self._all_reduce,
            teacher_log_probs=columns.get("teacher_log_probs"),
        )
        columns.update(advantages=advantages, kl=kl)
        if s.algo.use_opd:
            columns["opd_reverse_kl"] = reverse_kl(columns["old_log_probs"], columns["teacher_log_probs"])
        if returns is not None:
            columns["returns"] = returns
        names = {
            "advantages": "advantages",
            "kl": "kl",
            "log_probs": "old_log_probs",
            "ref_log_probs": "ref_log_probs",
            "returns": "returns",
            "values": "values",
            "rollout_log_probs": "rollout_log_probs",
            "teacher_log_probs": "teacher_log_probs",
            "opd_reverse_kl": "opd_reverse_kl",
        }
        return self._column_means({metric: columns[key] for metric, key in names.items() if key in columns}, mask)

    def _frozen(self, which: str):
        """The frozen model (or weights) `compute_log_probs(which)` scores with, from the backend's `self.frozen`
        ("ref", "teacher"); None for the policy's own ("old")."""
        if which not in LOG_PROB_COLUMNS:
            raise ValueError(f"compute_log_probs({which!r}): expected one of {sorted(LOG_PROB_COLUMNS)}")
        if which == "old":
            return None
        if which not in self.frozen:
            raise RuntimeError(f"{which} log-probs asked for, but no {which} model was loaded ({FROZEN_KEYS[which]})")
        return self.frozen[which]

    def _log_probs_perf(self, which: str, seconds: float) -> dict[str, float]:
        """`perf/<phase>_time` (s) of `compute_log_probs(which)` and, on CUDA, its peak GPU memory."""
        phase = log_probs_phase(which)
        return {f"perf/{phase}_time": seconds, **peak_gib(self.device, phase)}

    def _train_perf(self, seconds: float, *, trained: bool) -> dict[str, float]:
        """`perf/actor_train_time` (s) and, when the step trained, its rates over every rank of the group (tokens/s,
        TFLOP/s per GPU, MFU against `self.peak_tflops`), this rank's peak GPU memory (slime.train.throughput) and
        the tokens of its fullest micro-batch (`perf/micro_batch_tokens`, what that peak's activations held)."""
        perf = {"perf/actor_train_time": seconds}
        if not trained:
            return perf
        batch, p = self.batch, self.setup.parallelism
        fullest = batching.largest_micro_batch(
            batch, micro_batch_size=p.micro_batch_size, max_tokens=p.max_tokens_per_gpu
        )
        perf["perf/micro_batch_tokens"] = float(fullest)
        shard = [shard_train_flops(self.setup.model, batch), float(sum(len(t) for t in batch.tokens))]
        totals = self._all_reduce(torch.tensor(shard, dtype=torch.float64, device=self.device))
        perf |= train_rates(totals, seconds=seconds, num_gpus=self.world_size, peak_tflops=self.peak_tflops)
        return perf | peak_gib(self.device, "train")

    def _column_means(self, columns: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, float]:
        """`rollout/<column>`: mean over trajectories of each sample's masked token mean, all ranks."""
        batch = self.batch
        weights = token_weights(mask, batch.response_lengths, mode="per_sample", num_trajectories=1)
        names = sorted(columns)
        sums = torch.stack(
            [reduce(columns[k].float(), weights) for k in names] + [torch.tensor(float(len(batch)), device=self.device)]
        )
        sums = self._all_reduce(sums)
        count = float(sums[-1])
        return {f"rollout/{k}": float(v) / count for k, v in zip(names, sums[:-1])}

    def _actor_micro_loss(
        self,
        mb: list[int],
        step: int,
        weights: torch.Tensor,
        mask: torch.Tensor,
        log_probs: torch.Tensor,
        entropy: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The actor loss of micro-batch `mb` (sample indices) of optimizer step `step` from its flat
        log-probs / entropy Tensor[N] (with grad); `weights` are the step-level token weights."""
        s, batch = self.setup, self.batch
        pg_weights = weights
        if s.algo.pg_loss_constant_length is not None:
            pg_weights = self._weights(
                batch, mb, step, mask, "constant", constant_length=float(s.algo.pg_loss_constant_length)
            )
        old = self._pick("old_log_probs", mb)
        loss, metrics = actor_loss(
            log_probs=log_probs,
            old_log_probs=log_probs.detach() if old is None else old,
            advantages=self._pick("advantages", mb),
            weights=weights,
            pg_weights=pg_weights,
            algo=s.algo,
            loss_mask=mask,
            response_lengths=[batch.response_lengths[i] for i in mb],
            entropy=entropy,
            ref_log_probs=self._pick("ref_log_probs", mb),
            rollout_log_probs=self._pick("rollout_log_probs", mb),
        )
        reverse_kl = self._pick("opd_reverse_kl", mb)
        if reverse_kl is not None:  # the student's distance from the teacher, on the samples of this step
            metrics["opd_reverse_kl"] = reduce(reverse_kl, weights)
        return loss, metrics


class CriticSteps(BatchColumns):
    """The critic's micro-batch loss (docs/algorithms.md#value-loss)."""

    def _check_critic_columns(self) -> None:
        if "values" not in self.columns or "returns" not in self.columns:
            raise ValueError("the critic trains on a shard carrying its old values and the actor's returns")

    def _critic_micro_loss(
        self, mb: list[int], weights: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Clipped value loss of micro-batch `mb` from its values Tensor[N] (with grad); the weights
        already carry the mask."""
        out = clipped_value_loss(
            values, self._pick("values", mb), self._pick("returns", mb), value_clip=self.setup.algo.value_clip
        )
        loss = reduce(out["loss"], weights)
        return loss, {"value_loss": loss.detach(), "value_clipfrac": reduce(out["clipfrac"], weights)}
