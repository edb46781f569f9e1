"""The fsdp actor: a transformers causal LM trained with the policy losses of `slime.algo`.

Per rollout step (`train`): old and reference log-probs (forward-only; the old pass is skipped when
the reuse rule of REFERENCE.md §3.4 holds), advantages and returns for the configured estimator,
then K optimizer steps over micro-batches, gradients summed over ranks and clipped by global norm.
"""

from __future__ import annotations

import time

import torch

from slime.algo import log_probs_and_entropy, reduce, token_weights
from slime.train import batching
from slime.train.actor_loss import actor_loss, needs_ref
from slime.train.advantages import compute_advantages
from slime.train.base import TrainBackend
from slime.train.fsdp import checkpoint, parallel
from slime.train.fsdp.rank import FSDPRank
from slime.types import TrainBatch


class FSDPBackend(FSDPRank, TrainBackend):
    def init(self) -> int:
        s = self.setup
        self._build(init_path=s.model.hf_checkpoint, lr=s.train.lr, warmup_steps=s.train.lr_warmup_steps)
        self.ref_model = self._load_model(s.checkpoint.ref_load).eval() if needs_ref(s.algo) else None
        if s.checkpoint.load is not None:
            return checkpoint.load(self, s.checkpoint.load, s.checkpoint.ckpt_step)
        return 0

    def _load_model(self, path: str):
        from transformers import AutoModelForCausalLM

        # fp32 master weights; bf16 compute comes from autocast
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
        return model.to(self.device)

    # ---- log-probs -------------------------------------------------------------------------
    def _forward(self, model, batch: TrainBatch, indices: list[int], *, with_entropy: bool):
        """Flat (log_probs, entropy|None) over the response tokens of `indices`; grad if enabled."""
        rows, targets = self._response_rows(model, batch, indices)
        return log_probs_and_entropy(rows.float(), targets, temperature=self.setup.temperature, with_entropy=with_entropy)

    @torch.no_grad()
    def _forward_only(self, model, batch: TrainBatch) -> torch.Tensor:
        """Flat log-probs of every response token of the batch (in batch order), forward-only.

        Uses the training pass's exact micro-batches, so at the first step the recomputed log-probs
        equal these bit for bit (ppo_kl and kl_loss are exactly 0), whatever the padding.
        """
        micro = [mb for step in batching.step_indices(batch)
                 for mb in batching.micro_batches(step, self.setup.parallelism.micro_batch_size)]
        parts = {i: lp for mb in micro for i, lp in zip(mb, torch.split(
            self._forward(model, batch, mb, with_entropy=False)[0], [batch.response_lengths[i] for i in mb]))}
        return torch.cat([parts[i] for i in range(len(batch))])

    def _reuse_old_log_probs(self, batch: TrainBatch) -> bool:
        """REFERENCE.md §3.4: nothing but the loss needs ℓ_old -> ℓ_old := stopgrad(ℓ)."""
        a = self.setup.algo
        return (len(set(batch.step_ids)) == 1 and not needs_ref(a) and not a.use_tis
                and a.advantage_estimator not in ("gspo", "ppo"))

    # ---- training --------------------------------------------------------------------------
    def train(self, rollout_id: int, batch: TrainBatch, update: bool = True) -> dict:
        """K optimizer steps (none when `update` is False: PPO's critic-only warm-up).

        Returns {"steps": [metrics per optimizer step], "perf": timings, "rollout": per-trajectory means
        of the training columns, "returns": per-sample returns (ppo) or None}.
        """
        s, perf = self.setup, {}
        self.model.train()
        device = self.device
        everything = list(range(len(batch)))
        mask = batching.flat(batch.loss_masks, everything, dtype=torch.float32, device=device)
        rollout_lp = (batching.flat(batch.rollout_log_probs, everything, dtype=torch.float32, device=device)
                      if batch.rollout_log_probs is not None else None)
        if s.algo.use_tis and rollout_lp is None:
            raise ValueError("algo.use_tis needs engine log-probs on every sample; the rollout produced none")
        start = time.perf_counter()
        if s.algo.use_rollout_logprobs:
            old = rollout_lp
        else:
            old = None if self._reuse_old_log_probs(batch) else self._forward_only(self.model, batch)
        perf["perf/log_probs_time"] = time.perf_counter() - start
        ref = None
        if self.ref_model is not None:
            start = time.perf_counter()
            ref = self._forward_only(self.ref_model, batch)
            perf["perf/ref_log_probs_time"] = time.perf_counter() - start
        values = (batching.flat(batch.values, everything, dtype=torch.float32, device=device)
                  if batch.values is not None else None)
        advantages, returns, kl = compute_advantages(
            s.algo, rewards=torch.tensor(batch.rewards, dtype=torch.float32, device=device),
            response_lengths=batch.response_lengths, loss_mask=mask, old_log_probs=old, ref_log_probs=ref,
            values=values, all_reduce=lambda t: parallel.all_reduce_sum(t, self.world_size))
        columns = {"advantages": advantages, "kl": kl, "log_probs": old, "ref_log_probs": ref, "returns": returns,
                   "values": values, "rollout_log_probs": rollout_lp}
        rollout_metrics = self._column_means(batch, columns, mask)
        offsets = _offsets(batch.response_lengths)
        pick = lambda flat, mb: None if flat is None else torch.cat([flat[offsets[i]:offsets[i + 1]] for i in mb])  # noqa: E731
        start = time.perf_counter()
        steps = []
        if update:
            for step, indices in enumerate(batching.step_indices(batch)):
                def micro_loss(mb, weights, mb_mask, step=step):
                    log_probs, entropy = self._forward(self.model, batch, mb, with_entropy=True)
                    pg_weights = weights
                    if s.algo.pg_loss_constant_length is not None:
                        pg_weights = self._weights(batch, mb, step, mb_mask, "constant",
                                                   constant_length=float(s.algo.pg_loss_constant_length))
                    return actor_loss(
                        log_probs=log_probs, old_log_probs=log_probs.detach() if old is None else pick(old, mb),
                        advantages=pick(advantages, mb), weights=weights, pg_weights=pg_weights, algo=s.algo,
                        loss_mask=mb_mask, response_lengths=[batch.response_lengths[i] for i in mb], entropy=entropy,
                        ref_log_probs=pick(ref, mb), rollout_log_probs=pick(rollout_lp, mb))

                metrics = self._optimizer_step(batch, indices, step, micro_loss, prefix="train/")
                metrics["train/global_batch_size"] = float(batch.num_trajectories_per_step)
                steps.append(metrics)
        perf["perf/actor_train_time"] = time.perf_counter() - start
        per_sample_returns = None
        if returns is not None:
            per_sample_returns = [returns[offsets[i]:offsets[i + 1]].tolist() for i in everything]
        return {"steps": steps, "perf": perf, "rollout": rollout_metrics, "returns": per_sample_returns}

    def _column_means(self, batch: TrainBatch, columns: dict, mask: torch.Tensor) -> dict[str, float]:
        """`rollout/<column>`: mean over trajectories of each sample's masked token mean, all ranks."""
        weights = token_weights(mask, batch.response_lengths, mode="per_sample", num_trajectories=1)
        names = [k for k, v in columns.items() if v is not None]
        sums = torch.stack([reduce(columns[k].float(), weights) for k in names] + [torch.tensor(float(len(batch)),
                                                                                                device=self.device)])
        sums = parallel.all_reduce_sum(sums, self.world_size)
        count = float(sums[-1])
        return {f"rollout/{k}": float(v) / count for k, v in zip(names, sums[:-1])}


def _offsets(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out
