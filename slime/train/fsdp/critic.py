"""PPO's critic for the fsdp backend: the policy checkpoint with a one-output token head (the value).

The value of response token j is read at the position that predicts it (P−1+j), like the actor's
log-probs, and is never temperature-scaled. A critic started from the policy checkpoint gets a
zero-initialised head, so its first values are 0 and GAE starts from plain discounted rewards.
"""

from __future__ import annotations

import time

import torch
from transformers import AutoConfig, AutoModelForTokenClassification

from slime.train import batching, packing
from slime.train.fsdp.rank import FSDPRank
from slime.train.steps import CriticSteps
from slime.types import TrainBatch


class FSDPCritic(FSDPRank):
    """The critic role of the fsdp backend."""

    role = "critic"

    def init(self) -> int:
        s = self.setup
        self.critic_steps = CriticSteps(s)
        self._build(init_path=s.model.hf_checkpoint, lr=s.train.lr, warmup_steps=s.train.lr_warmup_steps)
        if s.checkpoint.load is not None:
            return self.load_checkpoint(s.checkpoint.load, s.checkpoint.ckpt_step)
        with torch.no_grad():
            self.model.score.weight.zero_()
            self.model.score.bias.zero_()
        return 0

    def _load_model(self, path: str, dtype: torch.dtype = torch.float32):
        config = AutoConfig.from_pretrained(path, num_labels=1, classifier_dropout=0.0)  # no dropout on values
        model = AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=dtype, attn_implementation=packing.register()
        )
        return model.to(self.device)

    def _values(self, batch: TrainBatch, indices: list[int]) -> torch.Tensor:
        """Values Tensor[N] (fp32) of the N response tokens of `indices`, from one packed forward; the
        one-output head needs no chunking."""
        packed = self._pack(indices)
        with self._autocast():
            out = self.model(**packed.model_kwargs()).logits
        return out[0, packed.rows, 0].float()

    @torch.no_grad()
    def compute_values(self) -> list[list[float]]:
        """Per-sample values of every response token (the old values of this rollout step)."""
        self.model.eval()
        batch = self.batch
        parts: dict[int, list[float]] = {}
        for mb in (mb for step in batching.step_indices(batch) for mb in self._micro_batches(step)):
            if not mb:
                self._dummy_loss(self.model)
                continue
            values = self._values(batch, mb)
            parts.update(zip(mb, (v.tolist() for v in torch.split(values, [batch.response_lengths[i] for i in mb]))))
        out = [parts[i] for i in range(len(batch))]
        self.set_column("values", out)
        return out

    def train(self, *, update: bool = True) -> dict:
        """K optimizer steps on the clipped value loss against the actor's returns (docs/algorithms.md#value-loss)."""
        batch = self.batch
        self.critic_steps.check_columns(self.shard)
        self.model.train()
        start = time.perf_counter()
        steps = []
        for step, indices in enumerate(batching.step_indices(batch) if update else []):

            def micro_loss(mb, weights, _mask):  # the weights already carry the mask
                return self.critic_steps.micro_loss(self.shard, mb, weights, self._values(batch, mb))

            metrics = self._optimizer_step(batch, indices, step, micro_loss, prefix="train/critic-")
            for name in ("value_loss", "value_clipfrac"):
                metrics[f"train/{name}"] = metrics.pop(f"train/critic-{name}")
            steps.append(metrics)
        return {"steps": steps, "perf": {"perf/critic_train_time": time.perf_counter() - start}}
