"""What the fsdp actor and critic share: one training rank's model, optimizer, schedule, step loop,
weight export and checkpoints.

A subclass provides `_load_model(path)` and its micro-batch losses; `_optimizer_step` runs the
micro-batches of one optimizer step, sums gradients over data-parallel ranks, clips by global norm
and steps, and returns the step's metrics already reduced over ranks.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from slime.models.checkpoint_names import to_checkpoint
from slime.models.hf_model import decoder_layers, text_config
from slime.train import batching, packing
from slime.train.actor_loss import reduction_mode, sum_metrics
from slime.train.base import TrainBackend
from slime.train.finite import NonFiniteError, check_finite_parameters, nonfinite_gradient
from slime.train.fsdp import checkpoint, float8, lora, parallel
from slime.train.schedule import lr_factor
from slime.train.vision_batch import VisionInputs
from slime.types import TrainBatch
from slime.vision.sequence import ModelImages
from slime.wire.tensors import Bucket, in_buckets

logger = logging.getLogger(__name__)

# (micro-batch sample indices, token weights Tensor[T], loss mask Tensor[T]) -> (loss, weighted metrics)
MicroBatchLoss = Callable[[list[int], torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class FSDPRank(TrainBackend):
    """Model, optimizer and step loop of one fsdp rank (actor or critic)."""

    router_tap = None  # the actor's MoE routing replay hooks (slime.models.moe.hf_routers.RouterTap), when it replays

    def _load_model(self, path: str, dtype: torch.dtype = torch.float32):
        """The role's HF model from `path` in `dtype`, on this rank's device."""
        raise NotImplementedError

    def _build(self, *, init_path: str, lr: float, warmup_steps: int) -> None:
        """Process group, model (data parallel applied), AdamW and the LR schedule."""
        s = self.setup
        if s.device == "cpu":
            torch.set_num_threads(s.train.num_threads)
        parallel.init_process_group(
            device=s.device,
            rank=self.rank,
            world_size=self.world_size,
            master_addr=self.master_addr,
            master_port=self.master_port,
        )
        self.device = torch.device("cuda", torch.cuda.current_device()) if s.device == "cuda" else torch.device("cpu")
        self.groups = parallel.Groups(self.layout, s.device)
        torch.manual_seed(s.seed + self.coords.dp_rank)  # the ranks of one tp group draw alike
        self.model = self._load_model(init_path, dtype=self._base_dtype)
        self.model_images = ModelImages.of_checkpoint(self.model, init_path)  # None: a text model
        if self.model_images is not None and s.train.freeze_vision:
            self.model.model.visual.requires_grad_(False)  # as loaded: not trained (a push still carries it whole)
        if self.trains_adapters:
            lora.apply_lora(self.model, s.model.lora)  # what trains in fp32, whatever the base's dtype
        self.trainable_params = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        if s.parallelism.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            if self.trains_adapters:  # the frozen embeddings' output must carry grad into the recomputed layers
                self.model.enable_input_require_grads()
        if s.parallelism.fp8:
            converted = float8.apply_float8(self.model, device=self.device)
            logger.info("parallelism.fp8: %d linears of the decoder layers train in float8", len(converted))
        parallel.apply_tensor_parallel(self.model, self.groups)
        if s.parallelism.fsdp.compile and s.device == "cuda":
            for layer in decoder_layers(self.model):
                layer.compile(dynamic=True)  # one graph for every layer and packed length
        self.model = parallel.apply_data_parallel(
            self.model,
            device=s.device,
            groups=self.groups,
            bf16_params=self._bf16_params,
            cpu_offload=s.parallelism.fsdp.cpu_offload,
        )
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=lr,
            betas=(s.train.adam_beta1, s.train.adam_beta2),
            eps=s.train.adam_eps,
            weight_decay=s.train.weight_decay,
            **self._adam_implementation(),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: lr_factor(
                step,
                total_steps=s.num_optimizer_steps,
                warmup_steps=warmup_steps,
                style=s.train.lr_decay_style,
                lr=lr,
                min_lr=s.train.min_lr,
            ),
        )
        self.pad_id = text_config(self.model.config).pad_token_id or 0
        self.global_step = 0

    @property
    def trains_adapters(self) -> bool:
        """The policy with `model.lora`: adapters train, the base stays frozen (`slime.train.fsdp.lora`)."""
        return self.role == "actor" and self.setup.model.lora.enabled

    def _all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the data-parallel ranks (the ranks of one tp group hold the same values)."""
        return parallel.all_reduce_sum(tensor, self.groups.dp)

    def _adam_implementation(self) -> dict:
        """AdamW's kernel: fused on the GPU; per tensor with tp, whose mix of tensor-parallel (DTensor) and
        plain parameters the multi-tensor kernels reject; torch's default otherwise."""
        if self.layout.tp > 1:
            return {"foreach": False}
        if self.device.type == "cuda" and not self.setup.parallelism.fsdp.cpu_offload:
            return {"fused": True}
        return {}

    @property
    def _bf16_params(self) -> bool:
        """bf16 compute through FSDP2's mixed-precision policy (fp32 shards); see `FSDPOptions`."""
        s = self.setup
        return s.precision == "bf16" and parallel.uses_fsdp(s.device) and s.parallelism.fsdp.mixed_precision == "fsdp2"

    @property
    def _base_dtype(self) -> torch.dtype:
        """The dtype the trained model is loaded in: fp32 master weights, except a LoRA policy's frozen base, held in
        bf16 where it computes in bf16 anyway (`_bf16_params`): half its memory, the same forward, since FSDP2's
        policy casts an fp32 shard to those same bf16 values. FSDP2 asks one dtype of the trainable parameters
        alone (`FSDPParamGroup._init_mp_dtypes`), and those stay fp32."""
        return self._frozen_dtype if self.trains_adapters else torch.float32

    @property
    def _frozen_dtype(self) -> torch.dtype:
        """The dtype of models that are never trained (the reference): bf16 when the trained model computes
        in bf16 from its fp32 shards, so both run the same bf16 weights; else fp32 under autocast."""
        return torch.bfloat16 if self._bf16_params else torch.float32

    def _autocast(self):
        s = self.setup
        if s.precision == "bf16" and self.device.type == "cuda" and not self._bf16_params:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _micro_batches(self, indices: list[int]) -> list[list[int]]:
        """The micro-batches of one optimizer step's samples (`batching.split`), padded with empty ones
        to the most any DP rank has, so every rank runs the same number of forwards per step."""
        p = self.setup.parallelism
        micro = batching.split(
            indices,
            [len(t) for t in self.batch.tokens],
            micro_batch_size=p.micro_batch_size,
            max_tokens=p.max_tokens_per_gpu,
        )
        count = parallel.all_reduce_max(torch.tensor(len(micro), device=self.device), self.groups.dp)
        return batching.pad_to(micro, int(count))

    def load_batch(self, rollout_id: int, batch: TrainBatch) -> None:
        super().load_batch(rollout_id, batch)
        has_images = self.model_images is not None and batch.images is not None
        self.vision_inputs = VisionInputs(self.model_images, batch) if has_images else None

    def _pack(self, indices: list[int]) -> packing.Packed:
        batch = self.batch
        packed = self._packed([batch.tokens[i] for i in indices], [batch.response_lengths[i] for i in indices])
        return packed if self.vision_inputs is None else self.vision_inputs.apply(packed, indices)

    def _packed(self, token_lists: list[list[int]], response_lengths: list[int]) -> packing.Packed:
        """The packed micro-batch on this rank's device; with float8 linears its tokens padded to their multiple."""
        multiple = float8.FLOAT8_MULTIPLE if self.setup.parallelism.fp8 else 1
        return packing.pack(token_lists, response_lengths, self.device, multiple_of=multiple, pad_id=self.pad_id)

    def _dummy_loss(self, model) -> torch.Tensor:
        """A zero loss from a one-token forward: an empty micro-batch still takes part in FSDP2's
        collectives (its backward adds zero gradients)."""
        packed = self._packed([[self.pad_id]], [0])
        if self.router_tap is not None:  # its one token routes freely
            self.router_tap.replay(None)
        with self._autocast():
            return model(**packed.model_kwargs()).logits.float().sum() * 0.0

    def _optimizer_step(
        self, batch: TrainBatch, indices: list[int], step: int, micro_loss: MicroBatchLoss, prefix: str
    ) -> dict[str, float]:
        """One optimizer step over `indices`; `micro_loss(mb, weights, mask)` returns (loss, weighted metrics)."""
        s = self.setup
        self.optimizer.zero_grad(set_to_none=True)
        scale = parallel.loss_scale(s.device, self.layout)
        totals: dict[str, torch.Tensor] = {}
        nonfinite_loss = torch.zeros((), dtype=torch.bool, device=self.device)  # read only if the norm is not finite
        for mb in self._micro_batches(indices):
            if not mb:
                (self._dummy_loss(self.model) * scale).backward()
                continue
            mask = self.shard.flat(batch.loss_masks, mb)
            loss, mb_metrics = micro_loss(mb, self.shard.weights(mb, step, mask, reduction_mode(s.algo)), mask)
            nonfinite_loss |= ~torch.isfinite(loss.detach())
            (loss * scale).backward()
            sum_metrics(totals, mb_metrics)
        parallel.sum_gradients(self.model, device=s.device, groups=self.groups)
        max_norm = s.train.clip_grad if s.train.clip_grad > 0 else float("inf")
        grad_norm = parallel.clip_grad_norm(self.model, max_norm, self.groups)
        skipped = not math.isfinite(float(grad_norm))  # the same on every rank: the norm is all-reduced
        if skipped:
            first = "the loss" if bool(nonfinite_loss) else nonfinite_gradient(self.model)
            self._nonfinite_step(prefix, first, grad_norm)
        else:
            self.optimizer.step()
            self.scheduler.step()
        self.global_step += 1
        names = sorted(totals)
        reduced = self._all_reduce(torch.stack([totals[k].float() for k in names]))
        metrics = {f"{prefix}{k}": float(v) for k, v in zip(names, reduced)}
        metrics[f"{prefix}grad_norm"] = float(grad_norm)
        metrics[f"{prefix}nonfinite_skipped"] = float(skipped)
        metrics[f"{prefix}trainable_params"] = float(self.trainable_params)
        metrics[f"{prefix}lr-pg_0"] = self.optimizer.param_groups[0]["lr"]
        return metrics

    def _nonfinite_step(self, prefix: str, first: str | None, grad_norm) -> None:
        """A step whose loss or gradients hold a NaN or inf: its update is dropped (train.on_nonfinite=skip), or
        NonFiniteError names the step and the first non-finite tensor (stop)."""
        self.optimizer.zero_grad(set_to_none=True)
        where = f"{prefix.rstrip('/')} step {self.global_step}: the gradient norm is {float(grad_norm)}"
        if self.setup.train.on_nonfinite != "skip":
            raise NonFiniteError(
                f"{where}; the first non-finite tensor on rank {self.rank} is {first or 'on another rank'}. "
                "Nothing was updated; set train.on_nonfinite=skip to drop such steps, or lower train.lr"
            )
        logger.warning("%s (%s): the step is skipped, nothing updated", where, first or "another rank's tensor")

    # ---- weights and checkpoints -------------------------------------------------------------
    def export_weights(self, bucket_bytes: int) -> Iterator[Bucket]:
        """Parameters (tied duplicates once; adapters merged into their bases) and persistent buffers under their
        checkpoint names (a MoE layer's experts one by one), in buckets of about `bucket_bytes`; sharded
        parameters are gathered on every rank, one at a time. A non-finite parameter refuses the push."""
        check_finite_parameters(self.model, "a weight push")
        if self.trains_adapters:
            weights = lora.merged_weights(self.model, _whole)
        else:
            weights = ((name, _whole(t.detach())) for name, t in self.model.named_parameters())
        tensors = itertools.chain(weights, persistent_buffers(self.model))
        held = (part for name, tensor in tensors for part in to_checkpoint(self.model, name, tensor).items())
        return in_buckets(held, bucket_bytes)

    def export_adapter(self, bucket_bytes: int) -> Iterator[Bucket]:
        check_finite_parameters(self.model, "an adapter push")
        return in_buckets(lora.synced_tensors(self.model, self.setup.model.lora, _whole), bucket_bytes)

    def save_hf(self, path: str) -> None:
        """With LoRA a peft adapter directory at `path` (and, with `model.lora.export_merged`, the merged HF
        model in `path`/merged); else the HF model (`TrainBackend.save_hf`). Collective; the source rank writes."""
        if not self.trains_adapters:
            return super().save_hf(path)
        s = self.setup
        tensors = lora.peft_adapter_tensors(self.model, s.model.lora, _whole)
        if self.layout.is_source(self.rank):
            lora.write_peft_adapter(tensors, s.model.lora, path, s.model.hf_checkpoint)
        if s.model.lora.export_merged:
            super().save_hf(str(Path(path) / "merged"))

    def save_checkpoint(self, rollout_id: int, root: str) -> None:
        check_finite_parameters(self.model, f"the checkpoint save of rollout {rollout_id}")
        checkpoint.save(self, Path(root), rollout_id)

    def load_checkpoint(self, root: str, ckpt_step: int | None) -> int:
        return checkpoint.load(self, root, ckpt_step)

    def shutdown(self) -> None:
        super().shutdown()
        parallel.destroy()


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """The full tensor of a parameter: DTensors (FSDP2, tp) are all-gathered, every rank taking part."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def persistent_buffers(model) -> Iterator[tuple[str, torch.Tensor]]:
    """The buffers a checkpoint of `model` holds (`state_dict`'s), such as a router's `e_score_correction_bias`."""
    saved = model.state_dict().keys()
    yield from ((name, buffer) for name, buffer in model.named_buffers() if name in saved)
