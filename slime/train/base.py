"""The interface every training backend implements, its typed setup, and the backend registry.

Backends are plain Python classes; the runtime wraps them in Ray actors (one per training rank), and
GPU tests drive them directly. Nothing here imports Ray.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib

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


class TrainBackend(abc.ABC):
    """One training rank. All ranks of a group receive the same calls in the same order."""

    def __init__(self, setup: TrainSetup, *, rank: int, world_size: int, master_addr: str, master_port: int):
        self.setup = setup
        self.rank = rank
        self.world_size = world_size
        self.master_addr = master_addr
        self.master_port = master_port

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


_BACKENDS = {"fsdp": "slime.train.fsdp.backend:FSDPBackend"}


def get_backend_class(name: str) -> type[TrainBackend]:
    """The backend class for `parallelism.backend`; imported lazily so optional deps stay optional."""
    if name not in _BACKENDS:
        raise ValueError(f"parallelism.backend={name!r} is not available; choose one of {sorted(_BACKENDS)}")
    module_name, attr = _BACKENDS[name].split(":")
    return getattr(importlib.import_module(module_name), attr)
