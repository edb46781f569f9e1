"""PPO's critic on the megatron backend: the policy's GPTModel with a one-output value head.

The value of response token j is read at the position that predicts it (P−1+j), like the actor's
log-probs, and is never temperature-scaled. The head starts at zero, so the first values are 0.
"""

from __future__ import annotations

import time

import torch

from slime.train import batching
from slime.train.megatron.rank import MegatronRank
from slime.train.steps import CriticSteps


class MegatronCritic(MegatronRank):
    """The critic role of the megatron backend."""

    role = "critic"
    head = "value"

    def init(self) -> int:
        s = self.setup
        self.critic_steps = CriticSteps(s)
        self._build(init_path=s.model.hf_checkpoint, lr=s.train.lr, warmup_steps=s.train.lr_warmup_steps)
        if s.checkpoint.load is not None:
            return self.load_checkpoint(s.checkpoint.load, s.checkpoint.ckpt_step)
        return 0

    def _score(self, hidden, packed, *, with_entropy: bool):
        weight = self.model[-1].module.output_layer.weight  # [1, h], replicated over tp
        values = (hidden[packed.rows[packed.cp_rank]] @ weight.t()).squeeze(-1).float()
        return values, None

    def compute_values(self) -> list[list[float]]:
        """Per-sample values of every response token (the old values of this rollout step)."""
        values = self._forward_only(batching.step_indices(self.batch))
        self.columns["values"] = values
        return [part.tolist() for part in torch.split(values.cpu(), self.batch.response_lengths)]

    def train(self, *, update: bool = True) -> dict:
        """K optimizer steps on the clipped value loss against the actor's returns (docs/algorithms.md#value-loss)."""
        batch = self.batch
        self.critic_steps.check_columns(self.shard)
        start = time.perf_counter()
        steps = []
        for step, indices in enumerate(batching.step_indices(batch) if update else []):

            def on_micro(mb, weights, _mask, values, _entropy):  # the weights already carry the mask
                return self.critic_steps.micro_loss(self.shard, mb, weights, values)

            metrics = self._optimizer_step(batch, indices, step, on_micro, prefix="train/critic-")
            for name in ("value_loss", "value_clipfrac"):
                if f"train/critic-{name}" in metrics:
                    metrics[f"train/{name}"] = metrics.pop(f"train/critic-{name}")
            steps.append(metrics)
        return {"steps": steps, "perf": {"perf/critic_train_time": time.perf_counter() - start}}
