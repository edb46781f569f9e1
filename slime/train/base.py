"""The interface every training backend implements, its typed setup, and the backend registry.

Backends are plain Python classes; the runtime wraps them in Ray actors (one per training rank), and
GPU tests drive them directly. Nothing here imports Ray.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
from pathlib import Path

from slime.config.schema import AlgoConfig, CheckpointConfig, ModelConfig, ParallelismConfig, RunConfig, TrainConfig
from slime.config.derive import Derived
from slime.types import TrainBatch


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
    def from_run_config(cls, cfg: RunConfig, derived: Derived) -> "TrainSetup":
        return cls(
            model=cfg.model, parallelism=cfg.parallelism, train=cfg.train, algo=cfg.algo, checkpoint=cfg.checkpoint,
            device=cfg.cluster.device, precision=derived.precision, temperature=cfg.rollout.temperature,
            max_response_len=cfg.rollout.max_response_len, seed=cfg.seed, num_optimizer_steps=derived.num_optimizer_steps,
        )


    @classmethod
    def for_critic(cls, cfg: RunConfig, derived: Derived) -> "TrainSetup":
        """The critic's setup: the actor's, with train.critic's lr/warm-up/load/save overrides."""
        c = cfg.train.critic
        train = dataclasses.replace(cfg.train, lr=c.lr if c.lr is not None else cfg.train.lr,
                                    lr_warmup_steps=c.lr_warmup_steps if c.lr_warmup_steps is not None
                                    else cfg.train.lr_warmup_steps)
        load = c.load
        if load is None and cfg.checkpoint.load is not None and (Path(cfg.checkpoint.load) / "critic").exists():
            load = f"{cfg.checkpoint.load}/critic"  # resuming a run whose critic was saved beside the actor
        checkpoint = dataclasses.replace(cfg.checkpoint, load=load, save=cls.for_critic_save_root(cfg), ref_load=None)
        setup = cls.from_run_config(cfg, derived)
        return dataclasses.replace(setup, train=train, checkpoint=checkpoint)

    @staticmethod
    def for_critic_save_root(cfg: RunConfig) -> str:
        return cfg.train.critic.save if cfg.train.critic.save is not None else f"{cfg.checkpoint.save}/critic"


class DistributedRank:
    """One rank of a training group (actor or critic): its setup and torch.distributed rendezvous."""

    def __init__(self, setup: TrainSetup, *, rank: int, world_size: int, master_addr: str, master_port: int):
        self.setup = setup
        self.rank = rank
        self.world_size = world_size
        self.master_addr = master_addr
        self.master_port = master_port


class TrainBackend(DistributedRank, abc.ABC):
    """One actor training rank. All ranks of a group receive the same calls in the same order."""

    @abc.abstractmethod
    def init(self) -> int:
        """Build the model and optimizer, load checkpoints; return the first rollout id to run."""

    @abc.abstractmethod
    def train(self, rollout_id: int, batch: TrainBatch) -> dict:
        """Compute log-probs and advantages, run K optimizer steps.

        Returns {"steps": [one `train/*` metrics dict per optimizer step], "perf": {timer: seconds}};
        step metrics are already reduced over all data-parallel ranks.
        """

    @abc.abstractmethod
    def save_hf(self, path: str) -> None:
        """Write HF-named safetensors + config (+ tokenizer) to `path`; collective, rank 0 writes."""

    @abc.abstractmethod
    def save_checkpoint(self, rollout_id: int, root: str) -> None:
        """Save model, optimizer, scheduler and RNG for `rollout_id` under `root`; collective."""

    def offload(self) -> None:
        """Free accelerator memory for a colocated engine (no-op on CPU)."""

    def onload(self) -> None:
        """Take accelerator memory back after `offload` (no-op on CPU)."""

    def shutdown(self) -> None:
        """Release process groups and other resources."""


_BACKENDS = {
    ("fsdp", "actor"): "slime.train.fsdp.backend:FSDPBackend",
    ("fsdp", "critic"): "slime.train.fsdp.critic:FSDPCritic",
}


def get_backend_class(name: str, role: str = "actor") -> type:
    """The class for `parallelism.backend` and role (actor | critic); imported lazily (optional deps)."""
    if (name, role) not in _BACKENDS:
        raise ValueError(f"parallelism.backend={name!r} has no {role}; available: {sorted(_BACKENDS)}")
    module_name, attr = _BACKENDS[(name, role)].split(":")
    return getattr(importlib.import_module(module_name), attr)
