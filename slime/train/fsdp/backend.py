"""The fsdp actor: a transformers causal LM trained with the policy losses of `slime.algo`.

Per rollout step (driven through `TrainBackend`): reference and old log-probs (forward-only, on the
training pass's own micro-batches), advantages and returns for the configured estimator, then K
optimizer steps over micro-batches, gradients summed over ranks and clipped by global norm.
"""

from __future__ import annotations

import contextlib
import time

import torch

from slime.models.hf_model import attention_for, auto_model_class
from slime.models.moe.hf_routers import RouterTap
from slime.models.moe.routes import stream_routes
from slime.train import batching, packing
from slime.train.fsdp import lora
from slime.train.fsdp.rank import FSDPRank
from slime.train.replayed_routes import RouteReplay
from slime.train.steps import LOG_PROB_COLUMNS, ActorSteps, frozen_model, log_probs_perf
from slime.train.throughput import begin_phase, matmul_ceiling_tflops, seconds_since
from slime.types import TrainBatch


class FSDPBackend(FSDPRank):
    """The actor role of the fsdp backend."""

    role = "actor"
    LOGITS_CHUNK_TOKENS = 1024  # response tokens whose fp32 logits exist at once

    def init(self) -> int:
        s = self.setup
        lr = s.model.lora.lr if s.model.lora.enabled and s.model.lora.lr is not None else s.train.lr
        self.routes = RouteReplay(s)
        self._build(init_path=s.model.hf_checkpoint, lr=lr, warmup_steps=s.train.lr_warmup_steps)
        peak_tflops = s.peak_tflops or matmul_ceiling_tflops(self.device)  # perf/mfu's denominator
        self.actor_steps = ActorSteps(
            s, all_reduce=self._all_reduce, world_size=self.world_size, peak_tflops=peak_tflops
        )
        self.router_tap = RouterTap(self.model) if self.routes.replays else None  # the policy's only
        # the reference model and the distillation teacher, by column; never trained. With LoRA a reference that is
        # the policy's own checkpoint is the policy with its adapters off (`lora.base_only`): no second copy
        self.base_gains = None
        checkpoints = dict(s.frozen_checkpoints)
        if self.trains_adapters and checkpoints.get("ref") == s.model.hf_checkpoint:
            del checkpoints["ref"]
            self.base_gains = {
                n: p.detach().clone() for n, p in self.model.named_parameters() if n in s.model.lora.train_params
            }
        self.frozen = {
            which: self._load_model(path, dtype=self._frozen_dtype).eval() for which, path in checkpoints.items()
        }
        if s.train.ref_offload:
            for model in self.frozen.values():
                model.to("cpu")
        if self.base_gains is not None:
            self.frozen["ref"] = self.model
        if s.checkpoint.load is not None:
            return self.load_checkpoint(s.checkpoint.load, s.checkpoint.ckpt_step)
        return 0

    def load_batch(self, rollout_id: int, batch: TrainBatch) -> None:
        super().load_batch(rollout_id, batch)
        self.routes.load(batch)

    def compute_advantages(self) -> dict[str, float]:
        return self.actor_steps.advantages(self.shard)

    def _load_model(self, path: str, dtype: torch.dtype = torch.float32):
        # fp32 master weights; bf16 compute comes from FSDP2's policy or autocast (`FSDPOptions`)
        attention = attention_for(path, packing.register())
        model = auto_model_class(path).from_pretrained(path, dtype=dtype, attn_implementation=attention)
        return model.to(self.device)

    # ---- log-probs -------------------------------------------------------------------------
    def _forward(self, model, batch: TrainBatch, indices: list[int], *, with_entropy: bool, record: bool = False):
        """Flat (log_probs Tensor[N], entropy Tensor[N] | None) in nats over the N response tokens of
        `indices`, from one packed forward; grad if enabled. The policy's forward replays the routes of
        `algo.routing_replay`, or (`record`) records its own.

        The LM head runs inside the model's forward (so FSDP2 holds its weight unsharded there) on the
        response rows only, `LOGITS_CHUNK_TOKENS` at a time: a micro-batch's fp32 logits never exist whole.
        """
        tap = self.router_tap if model is self.model else None
        if tap is not None:
            tap.replay(None if record else self._stream_routes(indices))
        with self._autocast(), tap.capture() if record else contextlib.nullcontext():
            out = packing.log_probs_and_entropy(
                model,
                self._pack(indices),
                temperature=self.setup.temperature,
                with_entropy=with_entropy,
                chunk_size=self.LOGITS_CHUNK_TOKENS,
            )
        if record:
            self.routes.recorded[tuple(indices)] = tap.take()
        return out

    def _stream_routes(self, indices: list[int]) -> torch.Tensor | None:
        """int64 `[T, layers, k]` routes of the packed stream of `indices` to replay (None: route freely)."""
        replay = self.routes
        if replay.sample_routes is not None:
            routes = stream_routes([replay.sample_routes[i] for i in indices], self.setup.model.num_experts)
            return torch.from_numpy(routes).long().to(self.device)
        if replay.mode.trainer_records_routes and replay.recorded:
            return replay.recorded_for(indices)
        return None

    def compute_log_probs(self, which: str) -> dict[str, float]:
        """Flat log-probs of every response token (batch order), forward-only, as column `<which>_log_probs`.

        Uses the training pass's exact micro-batches, so at the first step the recomputed log-probs
        equal these bit for bit (ppo_kl and kl_loss are exactly 0), whatever the padding.
        """
        frozen = frozen_model(which, self.frozen)
        model = self.model if frozen is None else frozen
        start = time.perf_counter()
        begin_phase(self.device)
        batch = self.batch
        micro = [mb for step in batching.step_indices(batch) for mb in self._micro_batches(step)]
        parts = {}
        model.train(which == "old")  # the actor in its training mode: the first step's ratio is exactly 1
        record = self.routes.records(frozen)
        base = lora.base_only(self.model, self.base_gains) if frozen is self.model else contextlib.nullcontext()
        with torch.no_grad(), self._on_device(model), base:
            for mb in micro:
                if not mb:
                    self._dummy_loss(model)
                    continue
                log_probs = self._forward(model, batch, mb, with_entropy=False, record=record)[0]
                parts.update(zip(mb, torch.split(log_probs, [batch.response_lengths[i] for i in mb])))
        self.columns[LOG_PROB_COLUMNS[which]] = torch.cat([parts[i] for i in range(len(batch))])
        return log_probs_perf(which, seconds_since(start, self.device), self.device)

    @contextlib.contextmanager
    def _on_device(self, model):
        """A frozen model (reference, teacher) on the device for its forward only with `train.ref_offload` (a
        no-op on CPU runs, where it never leaves the CPU)."""
        frozen = model is not self.model and any(model is m for m in self.frozen.values())
        offload = frozen and self.setup.train.ref_offload and self.device.type != "cpu"
        if offload:
            model.to(self.device)
        try:
            yield
        finally:
            if offload:
                model.to("cpu")

    # ---- training --------------------------------------------------------------------------
    def train(self, *, update: bool = True) -> dict:
        batch = self.batch
        self.model.train()
        start = time.perf_counter()
        begin_phase(self.device)
        steps = []
        for step, indices in enumerate(batching.step_indices(batch) if update else []):

            def micro_loss(mb, weights, mb_mask, step=step):
                log_probs, entropy = self._forward(self.model, batch, mb, with_entropy=True)
                return self.actor_steps.micro_loss(self.shard, mb, step, weights, mb_mask, log_probs, entropy)

            metrics = self._optimizer_step(batch, indices, step, micro_loss, prefix="train/")
            metrics["train/global_batch_size"] = float(batch.num_trajectories_per_step[step])
            steps.append(metrics)
        if self.router_tap is not None:
            self.router_tap.replay(None)
        perf = self.actor_steps.train_perf(self.shard, seconds_since(start, self.device), trained=bool(steps))
        return {"steps": steps, "perf": perf}
