"""`TrainSetup`, the typed sub-config a training rank receives, and what the driver decides from the
algorithm config alone. No torch here: the driver imports this module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from slime.algo.estimators import ESTIMATORS
from slime.config.derived import Derived
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
        return dataclasses.replace(setup, train=train, checkpoint=checkpoint)

    @staticmethod
    def for_critic_save_root(cfg: RunConfig) -> str:
        return cfg.train.critic.save if cfg.train.critic.save is not None else f"{cfg.checkpoint.save}/critic"


def needs_ref(algo: AlgoConfig) -> bool:
    """Reference log-probs are needed by the KL loss and by KL in the reward."""
    return algo.use_kl_loss or algo.kl_coef != 0


def needs_old_log_probs(algo: AlgoConfig, num_steps_per_rollout: int) -> bool:
    """REFERENCE.md §3.4's reuse rule, negated: with one optimizer step per rollout and nothing but the
    loss reading ℓ_old, ℓ_old := stopgrad(ℓ) of the training pass itself and no forward-only pass runs.

    Engine log-probs as ℓ_old (`use_rollout_logprobs`) need none either.
    """
    if algo.use_rollout_logprobs:
        return False
    estimator = ESTIMATORS.get(algo.advantage_estimator)
    return num_steps_per_rollout > 1 or needs_ref(algo) or algo.use_tis or estimator.needs_old_log_probs
