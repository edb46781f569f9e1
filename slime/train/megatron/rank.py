"""What the megatron actor and critic share: one rank's model chunks (megatron DDP), distributed
optimizer, LR schedule, and the micro-batch loop through megatron's pipeline schedules.

A micro-batch is a packed THD stream (`slime.train.megatron.batch`); its last-stage output is the final
hidden states, which a subclass scores (`_score`: log-probs or values of the response tokens of this
CP rank's rows). Scores are gathered over the CP ranks so every rank sees the micro-batch's full
per-token tensor; the loss then carries 1/cp because the gather's backward sums the CP ranks' copies.
Gradients are summed over data-parallel ranks (losses carry step-level weights).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed.nn.functional as dist_fn
from megatron.core import parallel_state as ps
from megatron.core.pipeline_parallel import get_forward_backward_func

from slime.train import batching
from slime.train.actor_loss import reduction_mode, sum_metrics
from slime.train.base import TrainBackend
from slime.train.finite import NonFiniteError, check_finite_parameters
from slime.train.megatron import batch as mbatch
from slime.train.megatron import checkpoint, hf_weights, optimizer, parallel, rope
from slime.train.megatron.model_config import build_model_chunks, compile_layers, transformer_config
from slime.types import TrainBatch
from slime.wire.tensors import Bucket

# (micro-batch sample indices, per-token scores Tensor[N], entropy Tensor[N] | None) -> (loss, metrics)
OnScores = Callable[[list[int], torch.Tensor, "torch.Tensor | None"], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class MegatronRank(TrainBackend):
    """Model chunks, optimizer and step loop of one megatron rank (actor or critic)."""

    head = "lm"  # build_model_chunks head: "lm" (actor) or "value" (critic)
    with_entropy = False

    def _build(self, *, init_path: str, lr: float, warmup_steps: int) -> None:
        s = self.setup
        if s.device == "cpu":
            torch.set_num_threads(s.train.num_threads)
        parallel.init(
            device=s.device,
            rank=self.rank,
            layout=self.layout,
            vpp=s.parallelism.vpp,
            master_addr=self.master_addr,
            master_port=self.master_port,
            seed=s.seed,
        )
        self.device = torch.device("cuda", torch.cuda.current_device()) if s.device == "cuda" else torch.device("cpu")
        dtype = torch.bfloat16 if s.precision == "bf16" else torch.float32
        self.config = transformer_config(
            s.model, s.parallelism, params_dtype=dtype, device=s.device, extra=self._megatron_fields()
        )
        chunks = build_model_chunks(s.model, self.config, head=self.head)
        self.rotary = rope.rotary_embedding(s.model, self.config)
        if s.device == "cuda":
            chunks = [c.cuda() for c in chunks]
        hf_weights.load_hf(chunks, init_path, s.model, head=self.head)
        if s.parallelism.compile_layers and s.device == "cuda":
            compile_layers(chunks)

        self.model = optimizer.wrap_ddp(chunks, self.config)
        self.optimizer, self.scheduler = optimizer.build(self.model, s, lr=lr, warmup_steps=warmup_steps)
        hf_weights.load_hf_main_params(self.optimizer, self.model, init_path, s.model, head=self.head)
        self.cp_group = ps.get_context_parallel_group()
        self.dp_group = ps.get_data_parallel_group()
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.is_last_stage = ps.is_pipeline_last_stage(ignore_virtual=True)
        self.pad_id = 0
        self.global_step = 0
        self._one = torch.ones((), dtype=torch.int, device=self.device)  # the schedules' token count (unused)

    def _megatron_fields(self) -> dict:
        """TransformerConfig fields beyond the model's and the layout's: `parallelism.megatron`."""
        return dict(self.setup.parallelism.megatron)

    def _route(self, chunk, mb: list[int], packed: mbatch.MicroBatch) -> None:
        """Before `chunk`'s forward of micro-batch `mb`: set its MoE routers up (the actor's routing replay)."""

    def _routed(self, chunk, mb: list[int]) -> None:
        """After `chunk`'s forward of micro-batch `mb`."""

    def _all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the data-parallel ranks (tp, cp and pp ranks of a shard hold the same values)."""
        return parallel.all_reduce(tensor, self.dp_group)

    # ---- micro-batches -----------------------------------------------------------------------
    def _micro_batches(self, indices: list[int]) -> list[list[int]]:
        """`batching.split` of one step's samples, padded with empty micro-batches to the most any DP rank
        has (expert-parallel ranks span DP ranks and must run alike) and, with virtual pipeline stages,
        to a multiple of pp."""
        p = self.setup.parallelism
        micro = batching.split(
            indices,
            [len(t) for t in self.batch.tokens],
            micro_batch_size=p.micro_batch_size,
            max_tokens=p.max_tokens_per_gpu,
        )
        count = torch.tensor(len(micro), device=self.device)
        count = int(parallel.all_reduce(count, self.dp_group, op=torch.distributed.ReduceOp.MAX))
        if p.vpp:
            count = -(-count // self.layout.pp) * self.layout.pp
        return batching.pad_to(micro, count)

    def _samples(self, mb: list[int]) -> tuple[list[list[int]], list[int]]:
        return [self.batch.tokens[i] for i in mb] or [[self.pad_id]], [self.batch.response_lengths[i] for i in mb] or [
            0
        ]

    def _pack_all(self, micro: list[list[int]]) -> list[mbatch.MicroBatch]:
        """The packed micro-batches; with virtual pipeline stages all of one length (megatron's
        interleaved schedule sends fixed-shape tensors)."""
        tp_multiple = self.layout.tp if self.config.sequence_parallel else 1
        cp = self.layout.cp
        samples = [self._samples(mb) for mb in micro]
        total = 0
        if self.config.virtual_pipeline_model_parallel_size:
            total = max(mbatch.padded_total(tokens, cp=cp, tp_multiple=tp_multiple) for tokens, _ in samples)
        return [
            mbatch.build(
                tokens,
                responses,
                cp=cp,
                cp_rank=torch.distributed.get_rank(self.cp_group) if cp > 1 else 0,
                tp_multiple=tp_multiple,
                pad_id=self.pad_id,
                device=self.device,
                min_total=total,
            )
            for tokens, responses in samples
        ]

    def _score(self, hidden: torch.Tensor, packed: mbatch.MicroBatch, *, with_entropy: bool):
        """(scores Tensor[n], entropy Tensor[n] | None) of this CP rank's rows; hidden: Tensor[t, h]."""
        raise NotImplementedError

    def _gather_cp(self, local: torch.Tensor, packed: mbatch.MicroBatch) -> torch.Tensor:
        """The micro-batch's full per-token Tensor[N] from every CP rank's row values (autograd-aware)."""
        cp = self.layout.cp
        if cp == 1:
            return local

        sizes = [len(i) for i in packed.index]
        padded = torch.nn.functional.pad(local, (0, max(sizes) - local.shape[0]))
        parts = dist_fn.all_gather(padded, group=self.cp_group)
        values = torch.cat([part[:n] for part, n in zip(parts, sizes)])
        return torch.zeros(packed.num_tokens, dtype=values.dtype, device=values.device).index_copy(
            0, torch.cat(packed.index), values
        )

    def _loss(self, mb: list[int], packed: mbatch.MicroBatch, on_scores: OnScores, with_entropy: bool, output):
        hidden = output[0]  # [t, h]
        scores, entropy = self._score(hidden, packed, with_entropy=with_entropy)
        scores = self._gather_cp(scores, packed)
        entropy = None if entropy is None else self._gather_cp(entropy, packed)
        if not mb:  # a padding micro-batch: zero loss, zero gradients
            return hidden.sum() * 0.0, self._one, {}
        loss, metrics = on_scores(mb, scores, entropy)
        return loss / self.layout.cp, self._one, metrics

    def _run(
        self, micro: list[list[int]], on_scores: OnScores, *, forward_only: bool, with_entropy: bool
    ) -> list[dict]:
        """Forward (and backward) every micro-batch through the pipeline; the last stage's per-micro-batch
        metric dicts (empty elsewhere)."""
        packs = list(zip(micro, self._pack_all(micro)))
        params = functools.partial(
            mbatch.MicroBatch.packed_seq_params,
            rotary=self.rotary,
            dtype=self.config.params_dtype,
            cp_group=self.cp_group,
        )

        def forward_step(data_iterator: Iterator, model):
            mb, packed = next(data_iterator)
            self._route(model, mb, packed)
            out = model(
                input_ids=packed.input_ids,
                position_ids=packed.position_ids,
                attention_mask=None,
                packed_seq_params=params(packed),
            )
            self._routed(model, mb)
            return out, functools.partial(self._loss, mb, packed, on_scores, with_entropy)

        iterators = [iter(packs) for _ in self.model] if len(self.model) > 1 else iter(packs)
        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iterators,
            model=self.model if len(self.model) > 1 else self.model[0],
            num_microbatches=len(packs),
            seq_length=max(p.input_ids.shape[1] for _, p in packs),
            micro_batch_size=1,
            forward_only=forward_only,
        )

    def _forward_only(self, indices_per_step: list[list[int]], with_entropy: bool = False) -> torch.Tensor:
        """Flat per-token scores of the whole shard (batch order), forward-only, on every pp stage."""
        batch = self.batch
        parts: dict[int, torch.Tensor] = {}

        def keep(mb, scores, _entropy):
            parts.update(zip(mb, torch.split(scores.detach(), [batch.response_lengths[i] for i in mb])))
            return scores.new_zeros(()), {}

        for chunk in self.model:
            chunk.eval()
        with torch.no_grad():
            for indices in indices_per_step:
                self._run(self._micro_batches(indices), keep, forward_only=True, with_entropy=with_entropy)
        total = sum(batch.response_lengths)
        flat = (
            torch.cat([parts[i] for i in range(len(batch))])
            if self.is_last_stage
            else torch.zeros(total, device=self.device)
        )
        flat = flat.to(self.device, torch.float32)
        if self.layout.pp > 1:  # every stage keeps the columns (advantages run everywhere)
            torch.distributed.broadcast(
                flat, torch.distributed.get_global_rank(self.pp_group, self.layout.pp - 1), group=self.pp_group
            )
        return flat

    # ---- one optimizer step ------------------------------------------------------------------
    def _optimizer_step(
        self, batch: TrainBatch, indices: list[int], step: int, on_micro, prefix: str
    ) -> dict[str, float]:
        """One optimizer step over `indices`; `on_micro(mb, weights, mask, scores, entropy)` -> (loss, metrics)."""
        for chunk in self.model:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        mode = reduction_mode(self.setup.algo)

        def on_scores(mb, scores, entropy):
            mask = self.shard.flat(batch.loss_masks, mb)
            return on_micro(mb, self.shard.weights(mb, step, mask, mode), mask, scores, entropy)

        outs = self._run(self._micro_batches(indices), on_scores, forward_only=False, with_entropy=self.with_entropy)
        _, grad_norm, _ = self.optimizer.step()
        if grad_norm is not None and not math.isfinite(float(grad_norm)):
            raise NonFiniteError(
                f"{prefix.rstrip('/')} step {self.global_step}: the gradient norm is {float(grad_norm)}; a checkpoint save or a "
                "weight push of the model it leaves is refused. Lower train.lr (the megatron backend cannot skip it)"
            )
        self.scheduler.step(increment=1)
        self.global_step += 1
        totals: dict[str, torch.Tensor] = {}
        for out in outs:
            sum_metrics(totals, out)
        metrics: dict[str, float] = {}
        if self.is_last_stage and totals:
            names = sorted(totals)
            reduced = self._all_reduce(torch.stack([totals[k].float() for k in names]))
            metrics = {f"{prefix}{k}": float(v) for k, v in zip(names, reduced)}
        metrics[f"{prefix}grad_norm"] = float(grad_norm)
        metrics[f"{prefix}lr-pg_0"] = self.optimizer.param_groups[0]["lr"]
        return metrics

    # ---- weights and checkpoints -------------------------------------------------------------
    def export_weights(self, bucket_bytes: int) -> Iterator[Bucket]:
        for chunk in self.model:
            check_finite_parameters(chunk, "a weight push")
        return hf_weights.export_hf(self.model, self.setup.model, bucket_bytes)

    def save_checkpoint(self, rollout_id: int, root: str) -> None:
        for chunk in self.model:
            check_finite_parameters(chunk, f"the checkpoint save of rollout {rollout_id}")
        checkpoint.save(self, Path(root), rollout_id)

    def load_checkpoint(self, root: str, ckpt_step: int | None) -> int:
        return checkpoint.load(self, root, ckpt_step)

    def shutdown(self) -> None:
        super().shutdown()
        parallel.destroy()
