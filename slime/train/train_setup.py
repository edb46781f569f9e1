"""`TrainSetup`, the typed sub-config a training rank receives, and what the driver decides from the
algorithm config alone. No torch here: the driver imports this module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from slime.algo.estimators import ESTIMATORS
from slime.config.derived import Derived
from slime.config.routing_replay import RoutingReplay
from slime.config.schema import AlgoConfig, CheckpointConfig, ModelConfig, ParallelismConfig, RunConfig, TrainConfig


@dataclasses.dataclass(kw_only=True)
class TrainSetup:
    """What a training rank needs: its own sub-configs plus run-level numbers, no DictConfig."""

    model: ModelConfig
    parallelism: ParallelismConfig
    train: TrainConfig
    algo: AlgoConfig
    checkpoint: CheckpointConfig
    device: str  # cpu | cuda
    precision: str  # fp32 | bf16
    temperature: float  # rollout temperature: log-probs use logits / temperature
    max_response_len: int  # tokens; the Dr.GRPO constant
    seed: int
    num_optimizer_steps: int  # over the whole run, for the LR schedule
    # frozen models whose log-probs the actor computes beside its own: "ref" -> checkpoint.ref_load (the KL
    # terms), "teacher" -> teacher.hf_checkpoint (on-policy distillation); HF directories of the policy's shape
    frozen_checkpoints: dict[str, str] = dataclasses.field(default_factory=dict)
    peak_tflops: float | None = None  # cluster.peak_tflops: one GPU's bf16 TFLOP/s for perf/mfu (None: measured)

    @classmethod
    def from_run_config(cls, cfg: RunConfig, derived: Derived) -> TrainSetup:
        return cls(
            model=cfg.model,
            parallelism=cfg.parallelism,
            train=cfg.train,
            algo=cfg.algo,
            checkpoint=cfg.checkpoint,
            device=cfg.cluster.device,
            precision=derived.precision,
            temperature=cfg.rollout.temperature,
            max_response_len=cfg.rollout.max_response_len,
            seed=cfg.seed,
            num_optimizer_steps=derived.num_optimizer_steps,
            frozen_checkpoints=frozen_checkpoints(cfg),
            peak_tflops=cfg.cluster.peak_tflops,
        )

    @classmethod
    def for_critic(cls, cfg: RunConfig, derived: Derived) -> TrainSetup:
        """The critic's setup: the actor's, with train.critic's lr/warm-up/load/save overrides."""
        c = cfg.train.critic
        train = dataclasses.replace(
            cfg.train,
            lr=c.lr if c.lr is not None else cfg.train.lr,
            lr_warmup_steps=c.lr_warmup_steps if c.lr_warmup_steps is not None else cfg.train.lr_warmup_steps,
        )
        load = c.load
        if load is None and cfg.checkpoint.load is not None and (Path(cfg.checkpoint.load) / "critic").exists():
            load = f"{cfg.checkpoint.load}/critic"  # resuming a run whose critic was saved beside the actor
        checkpoint = dataclasses.replace(cfg.checkpoint, load=load, save=cls.for_critic_save_root(cfg), ref_load=None)
        setup = cls.from_run_config(cfg, derived)
        return dataclasses.replace(setup, train=train, checkpoint=checkpoint, frozen_checkpoints={})

    @staticmethod
    def for_critic_save_root(cfg: RunConfig) -> str:
        return cfg.train.critic.save if cfg.train.critic.save is not None else f"{cfg.checkpoint.save}/critic"


def needs_ref(algo: AlgoConfig) -> bool:
    """Reference log-probs are needed by the KL loss and by KL in the reward."""
    return algo.use_kl_loss or algo.kl_coef != 0


def frozen_checkpoints(cfg: RunConfig) -> dict[str, str]:
    """The frozen models the actor scores the batch with, by column ("ref", "teacher"), in the order the driver
    asks for their log-probs: the reference model for the KL terms, the teacher for on-policy distillation."""
    found = {}
    if needs_ref(cfg.algo):
        found["ref"] = cfg.checkpoint.ref_load
    if cfg.algo.use_opd and cfg.teacher is not None:
        found["teacher"] = cfg.teacher.hf_checkpoint
    return found


def needs_old_log_probs(algo: AlgoConfig, num_steps_per_rollout: int) -> bool:
    """The reuse rule (docs/algorithms.md#log-probs-and-the-reuse-rule), negated: with one optimizer step per
    rollout and nothing but the loss reading ℓ_old, ℓ_old := stopgrad(ℓ) of the training pass itself and no
    forward-only pass runs.

    Engine log-probs as ℓ_old (`use_rollout_logprobs`) need none either. On-policy distillation reads the
    student's ℓ_old before the training pass, in its advantages. Routing replay `train` records the routes
    the training pass replays in it.
    """
    if algo.use_rollout_logprobs:
        return False
    estimator = ESTIMATORS.get(algo.advantage_estimator)
    records_routes = RoutingReplay(algo.routing_replay).trainer_records_routes  # the pass whose routes replay
    reads_old = needs_ref(algo) or algo.use_tis or algo.use_opd or estimator.needs_old_log_probs or records_routes
    return num_steps_per_rollout > 1 or reads_old
