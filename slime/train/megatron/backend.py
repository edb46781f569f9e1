"""The megatron actor: a megatron-core GPTModel trained with the policy losses of `slime.algo`.

Per rollout step (driven through `TrainBackend`): reference and old log-probs (forward-only, on the
training pass's own micro-batches), advantages and returns, then K optimizer steps; log-probs and
entropy are computed vocab-parallel over the TP ranks from the final hidden states, chunked.
"""

from __future__ import annotations

import time

import torch

from slime.train import batching
from slime.train.megatron import hf_weights, routes
from slime.train.megatron.batch import MicroBatch
from slime.train.megatron.logprobs import vocab_parallel_log_probs
from slime.train.megatron.model_config import lm_head_weight
from slime.train.megatron.rank import MegatronRank
from slime.train.replayed_routes import RouteReplay
from slime.train.steps import LOG_PROB_COLUMNS, ActorSteps, frozen_model, log_probs_perf
from slime.train.throughput import begin_phase, matmul_ceiling_tflops, seconds_since
from slime.types import TrainBatch


class MegatronBackend(MegatronRank):
    """The actor role of the megatron backend."""

    role = "actor"
    with_entropy = True
    LOGITS_CHUNK_TOKENS = 1024  # response tokens whose fp32 logits exist at once
    # what the routers do in the pass under way (algo.routing_replay): record their choice, or replay routes
    _recording = False
    _replaying = False

    def init(self) -> int:
        s = self.setup
        self.routes = RouteReplay(s)  # before the build: the model's config asks whether it replays
        self._build(init_path=s.model.hf_checkpoint, lr=s.train.lr, warmup_steps=s.train.lr_warmup_steps)
        peak_tflops = s.peak_tflops or matmul_ceiling_tflops(self.device)  # perf/mfu's denominator
        self.actor_steps = ActorSteps(
            s, all_reduce=self._all_reduce, world_size=self.world_size, peak_tflops=peak_tflops
        )
        # the reference model and the distillation teacher, by column: CPU copies of this rank's parameters
        self.frozen = {which: self._load_frozen(path) for which, path in s.frozen_checkpoints.items()}
        if s.checkpoint.load is not None:
            return self.load_checkpoint(s.checkpoint.load, s.checkpoint.ckpt_step)
        return 0

    def load_batch(self, rollout_id: int, batch: TrainBatch) -> None:
        super().load_batch(rollout_id, batch)
        self.routes.load(batch)

    def compute_advantages(self) -> dict[str, float]:
        return self.actor_steps.advantages(self.shard)

    # ---- frozen weights (reference, teacher) ----------------------------------------------------
    def _load_frozen(self, path: str) -> dict[str, torch.Tensor]:
        """A frozen model of the policy's architecture as a CPU copy of this rank's parameters (swapped in for
        its forward)."""
        live = self._param_copy()
        hf_weights.load_hf(self.model, path, self.setup.model)
        ref = self._param_copy()
        self._load_params(live)
        return ref

    def _param_copy(self) -> dict[str, torch.Tensor]:
        return {
            f"{i}.{n}": p.detach().to("cpu", copy=True)
            for i, chunk in enumerate(self.model)
            for n, p in hf_weights.state_tensors(chunk.module)
        }

    @torch.no_grad()
    def _load_params(self, state: dict[str, torch.Tensor]) -> None:
        for i, chunk in enumerate(self.model):
            for n, p in hf_weights.state_tensors(chunk.module):
                p.copy_(state[f"{i}.{n}"])

    # ---- scores --------------------------------------------------------------------------------
    def _score(self, hidden, packed, *, with_entropy: bool):
        rows = packed.rows[packed.cp_rank]
        weight = lm_head_weight(self.model[-1].module)
        return vocab_parallel_log_probs(
            hidden[rows],
            weight,
            packed.targets[packed.cp_rank],
            temperature=self.setup.temperature,
            with_entropy=with_entropy,
            chunk_size=self.LOGITS_CHUNK_TOKENS,
            group=self.tp_group,
        )

    def compute_log_probs(self, which: str) -> dict[str, float]:
        """Flat log-probs of every response token (batch order), forward-only, as column `<which>_log_probs`."""
        frozen = frozen_model(which, self.frozen)
        start = time.perf_counter()
        begin_phase(self.device)
        live = self._param_copy() if frozen is not None else None
        if live is not None:
            self._load_params(frozen)
        self._recording = self.routes.records(frozen)
        self._replaying = frozen is None and self.routes.replays and not self._recording
        try:
            self.columns[LOG_PROB_COLUMNS[which]] = self._forward_only(batching.step_indices(self.batch))
        finally:
            self._recording = self._replaying = False
            if live is not None:
                self._load_params(live)
        return log_probs_perf(which, seconds_since(start, self.device), self.device)

    # ---- MoE routing replay (slime.train.replayed_routes.RouteReplay) ----------------------------------------
    def _megatron_fields(self) -> dict:
        return super()._megatron_fields() | ({"moe_enable_routing_replay": True} if self.routes.replays else {})

    def _route(self, chunk, mb: list[int], packed: MicroBatch) -> None:
        if not self.routes.replays:
            return
        routers = routes.moe_routers(chunk)
        if self._recording:
            routes.record(routers)
        else:
            routes.replay(routers, self._replayed(mb, packed) if self._replaying and mb else None)

    def _routed(self, chunk, mb: list[int]) -> None:
        if self._recording:
            self.routes.recorded.setdefault(tuple(mb), {}).update(routes.recorded(routes.moe_routers(chunk)))

    def _replayed(self, mb: list[int], packed: MicroBatch) -> dict[int, torch.Tensor]:
        """Micro-batch `mb`'s routes by layer number: the engine's in its local layout, or the log-prob pass's."""
        if self.routes.sample_routes is None:
            return self.routes.recorded_for(mb)
        sp = self.layout.tp if self.config.sequence_parallel else 1
        local = routes.layout_routes(
            [self.routes.sample_routes[i] for i in mb],
            packed,
            cp=self.layout.cp,
            sp_size=sp,
            sp_rank=torch.distributed.get_rank(self.tp_group) if sp > 1 else 0,
            num_experts=self.setup.model.num_experts,
        )
        return routes.by_layer(local, self.device)

    # ---- training ------------------------------------------------------------------------------
    def train(self, *, update: bool = True) -> dict:
        batch = self.batch
        start = time.perf_counter()
        begin_phase(self.device)
        steps = []
        self._replaying = self.routes.replays
        for step, indices in enumerate(batching.step_indices(batch) if update else []):

            def on_micro(mb, weights, mask, log_probs, entropy, step=step):
                return self.actor_steps.micro_loss(self.shard, mb, step, weights, mask, log_probs, entropy)

            metrics = self._optimizer_step(batch, indices, step, on_micro, prefix="train/")
            metrics["train/global_batch_size"] = float(batch.num_trajectories_per_step[step])
            steps.append(metrics)
        self._replaying = False
        perf = self.actor_steps.train_perf(self.shard, seconds_since(start, self.device), trained=bool(steps))
        return {"steps": steps, "perf": perf}
