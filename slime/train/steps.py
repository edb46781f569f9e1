"""What every backend's actor and critic do the same way on a loaded shard, whatever the model code:
advantages and their `rollout/*` means, the per-micro-batch actor and critic losses from `slime.algo`, and the
step's `perf/*` rates.

A backend holds one `ActorSteps` (or `CriticSteps`), built in its `init` with what the steps need from it (its
setup, its sum over the data-parallel ranks, its world size), and passes the loaded shard (`LoadedShard`) and its
own forward's outputs to each call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from slime.algo.advantages import reverse_kl
from slime.algo.reduction import reduce, token_weights
from slime.algo.value_loss import clipped_value_loss
from slime.train import batching
from slime.train.actor_loss import actor_loss
from slime.train.shard import LoadedShard
from slime.train.throughput import peak_gib, shard_train_flops, train_rates
from slime.train.token_advantages import compute_advantages
from slime.train.train_setup import TrainSetup

AllReduce = Callable[[torch.Tensor], torch.Tensor]  # a sum over the group's data-parallel ranks

LOG_PROB_COLUMNS = {"old": "old_log_probs", "ref": "ref_log_probs", "teacher": "teacher_log_probs"}
# what loads each frozen model (`TrainSetup.frozen_checkpoints`), for the error when one is asked for but absent
FROZEN_KEYS = {"ref": "checkpoint.ref_load", "teacher": "model@teacher with algo.use_opd"}


def log_probs_phase(which: str) -> str:
    """The name of `compute_log_probs(which)` in `perf/*` keys: log_probs for the policy's own, else <which>_log_probs."""
    return "log_probs" if which == "old" else f"{which}_log_probs"


def frozen_model(which: str, frozen: dict):
    """The frozen model (or weights) `compute_log_probs(which)` scores with, from a backend's frozen models by
    column ("ref", "teacher"); None for the policy's own ("old")."""
    if which not in LOG_PROB_COLUMNS:
        raise ValueError(f"compute_log_probs({which!r}): expected one of {sorted(LOG_PROB_COLUMNS)}")
    if which == "old":
        return None
    if which not in frozen:
        raise RuntimeError(f"{which} log-probs asked for, but no {which} model was loaded ({FROZEN_KEYS[which]})")
    return frozen[which]


def log_probs_perf(which: str, seconds: float, device: torch.device) -> dict[str, float]:
    """`perf/<phase>_time` (s) of `compute_log_probs(which)` and, on CUDA, its peak GPU memory."""
    phase = log_probs_phase(which)
    return {f"perf/{phase}_time": seconds, **peak_gib(device, phase)}


class ActorSteps:
    """The actor's advantages, micro-batch loss and train-phase rates.

    Args:
        setup: the role's setup (its algo, model and parallelism sizes).
        all_reduce: the backend's sum over its group's data-parallel ranks.
        world_size: ranks in the group (the rates are per GPU).
        peak_tflops: the matmul ceiling `perf/mfu` divides by.
    """

    def __init__(self, setup: TrainSetup, *, all_reduce: AllReduce, world_size: int, peak_tflops: float):
        self.setup = setup
        self.all_reduce = all_reduce
        self.world_size = world_size
        self.peak_tflops = peak_tflops

    def advantages(self, shard: LoadedShard) -> dict[str, float]:
        """Advantages (and returns, KL, distillation's reverse KL) as columns of `shard`; their `rollout/*`
        means over every shard of the group."""
        algo, batch, columns = self.setup.algo, shard.batch, shard.columns
        everything = list(range(len(batch)))
        mask = shard.flat(batch.loss_masks, everything)
        if batch.rollout_log_probs is not None:
            columns["rollout_log_probs"] = shard.flat(batch.rollout_log_probs, everything)
        if algo.use_tis and "rollout_log_probs" not in columns:
            raise ValueError("algo.use_tis needs engine log-probs on every sample; the rollout produced none")
        if algo.use_rollout_logprobs:
            columns["old_log_probs"] = columns["rollout_log_probs"]
        advantages, returns, kl = compute_advantages(
            algo,
            rewards=torch.tensor(batch.rewards, dtype=torch.float32, device=shard.device),
            response_lengths=batch.response_lengths,
            loss_mask=mask,
            old_log_probs=columns.get("old_log_probs"),
            ref_log_probs=columns.get("ref_log_probs"),
            values=columns.get("values"),
            all_reduce=self.all_reduce,
            teacher_log_probs=columns.get("teacher_log_probs"),
        )
        columns.update(advantages=advantages, kl=kl)
        if algo.use_opd:
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
        means = {metric: columns[key] for metric, key in names.items() if key in columns}
        return self._column_means(shard, means, mask)

    def _column_means(
        self, shard: LoadedShard, columns: dict[str, torch.Tensor], mask: torch.Tensor
    ) -> dict[str, float]:
        """`rollout/<column>`: mean over trajectories of each sample's masked token mean, all ranks."""
        batch = shard.batch
        weights = token_weights(mask, batch.response_lengths, mode="per_sample", num_trajectories=1)
        names = sorted(columns)
        count = torch.tensor(float(len(batch)), device=shard.device)
        sums = self.all_reduce(torch.stack([reduce(columns[k].float(), weights) for k in names] + [count]))
        return {f"rollout/{k}": float(v) / float(sums[-1]) for k, v in zip(names, sums[:-1])}

    def train_perf(self, shard: LoadedShard, seconds: float, *, trained: bool) -> dict[str, float]:
        """`perf/actor_train_time` (s) and, when the step trained, its rates over every rank of the group (tokens/s,
        TFLOP/s per GPU, MFU against `peak_tflops`), this rank's peak GPU memory (slime.train.throughput), the
        tokens of its fullest micro-batch (`perf/micro_batch_tokens`, what that peak's activations held) and the most
        micro-batches one of its optimizer steps took (`perf/micro_batches_per_step`)."""
        perf = {"perf/actor_train_time": seconds}
        if not trained:
            return perf
        batch, p = shard.batch, self.setup.parallelism
        fullest, most = batching.micro_batch_extent(
            batch, micro_batch_size=p.micro_batch_size, max_tokens=p.max_tokens_per_gpu
        )
        perf["perf/micro_batch_tokens"], perf["perf/micro_batches_per_step"] = float(fullest), float(most)
        counts = [shard_train_flops(self.setup.model, batch), float(sum(len(t) for t in batch.tokens))]
        totals = self.all_reduce(torch.tensor(counts, dtype=torch.float64, device=shard.device))
        perf |= train_rates(totals, seconds=seconds, num_gpus=self.world_size, peak_tflops=self.peak_tflops)
        return perf | peak_gib(shard.device, "train")

    def micro_loss(
        self,
        shard: LoadedShard,
        mb: list[int],
        step: int,
        weights: torch.Tensor,
        mask: torch.Tensor,
        log_probs: torch.Tensor,
        entropy: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The actor loss of micro-batch `mb` (sample indices) of optimizer step `step` from its flat
        log-probs / entropy Tensor[N] (with grad); `weights` are the step-level token weights."""
        algo, batch = self.setup.algo, shard.batch
        pg_weights = weights
        if algo.pg_loss_constant_length is not None:
            length = float(algo.pg_loss_constant_length)
            pg_weights = shard.weights(mb, step, mask, "constant", constant_length=length)
        old = shard.pick("old_log_probs", mb)
        loss, metrics = actor_loss(
            log_probs=log_probs,
            old_log_probs=log_probs.detach() if old is None else old,
            advantages=shard.pick("advantages", mb),
            weights=weights,
            pg_weights=pg_weights,
            algo=algo,
            loss_mask=mask,
            response_lengths=[batch.response_lengths[i] for i in mb],
            entropy=entropy,
            ref_log_probs=shard.pick("ref_log_probs", mb),
            rollout_log_probs=shard.pick("rollout_log_probs", mb),
        )
        reverse_kl = shard.pick("opd_reverse_kl", mb)
        if reverse_kl is not None:  # the student's distance from the teacher, on the samples of this step
            metrics["opd_reverse_kl"] = reduce(reverse_kl, weights)
        return loss, metrics


class CriticSteps:
    """The critic's micro-batch loss (docs/algorithms.md#value-loss)."""

    def __init__(self, setup: TrainSetup):
        self.setup = setup

    @staticmethod
    def check_columns(shard: LoadedShard) -> None:
        if "values" not in shard.columns or "returns" not in shard.columns:
            raise ValueError("the critic trains on a shard carrying its old values and the actor's returns")

    def micro_loss(
        self, shard: LoadedShard, mb: list[int], weights: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Clipped value loss of micro-batch `mb` from its values Tensor[N] (with grad); the weights
        already carry the mask."""
        old, returns = shard.pick("values", mb), shard.pick("returns", mb)
        out = clipped_value_loss(values, old, returns, value_clip=self.setup.algo.value_clip)
        loss = reduce(out["loss"], weights)
        return loss, {"value_loss": loss.detach(), "value_clipfrac": reduce(out["clipfrac"], weights)}
