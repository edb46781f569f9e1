"""The fsdp training backend: a transformers causal LM, AdamW, data parallel over ranks.

One instance is one training rank. Per rollout step (`train`): old and reference log-probs
(forward-only, skipped when the reuse rule of REFERENCE.md §3.4 holds), advantages, then K optimizer
steps over micro-batches, with gradients summed over ranks and clipped by global norm.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import torch

from slime.algo import broadcast_to_tokens, token_weights, whiten
from slime.train import batching
from slime.train.actor_loss import actor_loss, needs_entropy, needs_ref, reduction_mode, sum_metrics
from slime.train.base import TrainBackend
from slime.train.fsdp import checkpoint, parallel
from slime.train.schedule import lr_factor
from slime.types import TrainBatch

logger = logging.getLogger(__name__)


class FSDPBackend(TrainBackend):
    def init(self) -> int:
        s = self.setup
        if s.device == "cpu":
            torch.set_num_threads(s.train.num_threads)
        parallel.init_process_group(device=s.device, rank=self.rank, world_size=self.world_size,
                                    master_addr=self.master_addr, master_port=self.master_port)
        self.device = torch.device("cuda", torch.cuda.current_device()) if s.device == "cuda" else torch.device("cpu")
        torch.manual_seed(s.seed + self.rank)
        self.model = self._load_model(s.model.hf_checkpoint)
        if s.parallelism.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.model = parallel.apply_data_parallel(self.model, device=s.device, world_size=self.world_size)
        self.ref_model = self._load_model(s.checkpoint.ref_load).eval() if needs_ref(s.algo) else None
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=s.train.lr, betas=(s.train.adam_beta1, s.train.adam_beta2),
            eps=s.train.adam_eps, weight_decay=s.train.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: lr_factor(
            step, total_steps=s.num_optimizer_steps, warmup_steps=s.train.lr_warmup_steps,
            style=s.train.lr_decay_style, lr=s.train.lr, min_lr=s.train.min_lr))
        self.pad_id = self.model.config.pad_token_id or 0
        self.global_step = 0
        start = 0
        if s.checkpoint.load is not None:
            start = checkpoint.load(self, s.checkpoint.load, s.checkpoint.ckpt_step)
        return start

    def _load_model(self, path: str):
        from transformers import AutoModelForCausalLM

        dtype = torch.float32  # fp32 master weights; bf16 compute comes from autocast
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        return model.to(self.device)

    def _autocast(self):
        if self.setup.precision == "bf16" and self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ---- log-probs -------------------------------------------------------------------------
    def _forward(self, model, batch: TrainBatch, indices: list[int], *, with_entropy: bool):
        """Flat (log_probs, entropy|None) over the response tokens of `indices`; grad if enabled."""
        from slime.algo import log_probs_and_entropy

        input_ids, attention_mask = batching.pad_right([batch.tokens[i] for i in indices], self.pad_id, self.device)
        with self._autocast():
            logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        rows, targets = batching.response_rows(logits, input_ids, batch, indices)
        return log_probs_and_entropy(rows.float(), targets, temperature=self.setup.temperature, with_entropy=with_entropy)

    @torch.no_grad()
    def _forward_only(self, model, batch: TrainBatch) -> list[torch.Tensor]:
        """Per-sample log-prob tensors of the whole batch, forward-only."""
        out: list[torch.Tensor] = []
        for mb in batching.micro_batches(list(range(len(batch))), self.setup.parallelism.micro_batch_size):
            log_probs, _ = self._forward(model, batch, mb, with_entropy=False)
            out.extend(torch.split(log_probs, [batch.response_lengths[i] for i in mb]))
        return out

    def _reuse_old_log_probs(self, batch: TrainBatch) -> bool:
        """REFERENCE.md §3.4: one step per rollout and nothing else needs ℓ_old -> ℓ_old := stopgrad(ℓ)."""
        return len(set(batch.step_ids)) == 1 and not needs_ref(self.setup.algo)

    # ---- training --------------------------------------------------------------------------
    def train(self, rollout_id: int, batch: TrainBatch) -> dict:
        timings = {}
        self.model.train()
        start = time.perf_counter()
        old = None if self._reuse_old_log_probs(batch) else self._forward_only(self.model, batch)
        timings["perf/log_probs_time"] = time.perf_counter() - start
        ref = None
        if self.ref_model is not None:
            start = time.perf_counter()
            ref = self._forward_only(self.ref_model, batch)
            timings["perf/ref_log_probs_time"] = time.perf_counter() - start
        advantages = self._advantages(batch)
        start = time.perf_counter()
        steps = [self._optimizer_step(batch, indices, step, old, ref, advantages)
                 for step, indices in enumerate(batching.step_indices(batch))]
        timings["perf/actor_train_time"] = time.perf_counter() - start
        return {"steps": steps, "perf": timings}

    def _advantages(self, batch: TrainBatch) -> list[torch.Tensor]:
        """GRPO: each sample's (already group-normalised) reward on every response token."""
        rewards = torch.tensor(batch.rewards, dtype=torch.float32, device=self.device)
        flat = broadcast_to_tokens(rewards, batch.response_lengths)
        if self.setup.algo.normalize_advantages:
            mask = batching.flat(batch.loss_masks, list(range(len(batch))), dtype=torch.float32, device=self.device)
            flat = whiten(flat, mask, all_reduce=lambda t: parallel.all_reduce_sum(t, self.world_size))
        return list(torch.split(flat, batch.response_lengths))

    def _optimizer_step(self, batch, indices, step, old, ref, advantages) -> dict[str, float]:
        s = self.setup
        self.optimizer.zero_grad(set_to_none=True)
        scale = parallel.loss_scale(s.device, self.world_size)
        totals: dict[str, torch.Tensor] = {}
        for mb in batching.micro_batches(indices, s.parallelism.micro_batch_size):
            lengths = [batch.response_lengths[i] for i in mb]
            log_probs, entropy = self._forward(self.model, batch, mb, with_entropy=needs_entropy(s.algo))
            mask = batching.flat(batch.loss_masks, mb, dtype=torch.float32, device=self.device)
            weights = token_weights(
                mask, lengths, mode=reduction_mode(s.algo), num_trajectories=batch.num_trajectories_per_step,
                total_masked_tokens=float(batch.masked_tokens_per_step[step]),
            )
            pick = lambda per_sample: torch.cat([per_sample[i] for i in mb])  # noqa: E731
            rollout_lp = (batching.flat(batch.rollout_log_probs, mb, dtype=torch.float32, device=self.device)
                          if batch.rollout_log_probs is not None else None)
            loss, mb_metrics = actor_loss(
                log_probs=log_probs, old_log_probs=log_probs.detach() if old is None else pick(old),
                advantages=pick(advantages), weights=weights, algo=s.algo, entropy=entropy,
                ref_log_probs=None if ref is None else pick(ref), rollout_log_probs=rollout_lp,
            )
            (loss * scale).backward()
            sum_metrics(totals, mb_metrics)
        parallel.sum_gradients(self.model, device=s.device, world_size=self.world_size)
        grad_norm = self._clip_gradients()
        self.optimizer.step()
        self.scheduler.step()
        self.global_step += 1
        names = sorted(totals)
        reduced = parallel.all_reduce_sum(torch.stack([totals[k].float() for k in names]), self.world_size)
        metrics = {f"train/{k}": float(v) for k, v in zip(names, reduced)}
        metrics["train/grad_norm"] = grad_norm
        metrics["train/lr-pg_0"] = self.optimizer.param_groups[0]["lr"]
        metrics["train/global_batch_size"] = float(batch.num_trajectories_per_step)
        return metrics

    def _clip_gradients(self) -> float:
        max_norm = self.setup.train.clip_grad if self.setup.train.clip_grad > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        if hasattr(norm, "full_tensor"):  # DTensor under FSDP2
            norm = norm.full_tensor()
        return float(norm)

    # ---- weights and checkpoints -------------------------------------------------------------
    def save_hf(self, path: str) -> None:
        checkpoint.save_hf(self, Path(path))

    def save_checkpoint(self, rollout_id: int, root: str) -> None:
        checkpoint.save(self, Path(root), rollout_id)

    def shutdown(self) -> None:
        parallel.destroy()
