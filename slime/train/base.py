"""`TrainBackend`: the interface every training backend implements (fsdp and megatron), actor
and critic alike; each rank receives a `TrainSetup` (`slime.train.train_setup`).

Backends are plain Python classes: the runtime wraps one per training rank in a Ray actor and sends
every rank of a group the same calls in the same order; GPU tests drive them directly.

One rollout step, as the driver calls it (docs/architecture.md#synchronous-loop):

    load_batch(rollout_id, shard)       every rank of data-parallel shard d receives shard d
    compute_values()                    critic: per-sample values            -> actor.set_column("values")
    compute_log_probs("ref" | "old")    actor: forward-only passes, kept on the rank as columns
    compute_advantages()                actor: advantages / returns (+ rollout-side column means)
    train(update=...)                   K optimizer steps on the shard
    get_column("returns")               actor -> critic.set_column("returns"); critic.train()

Results are read from the rank that owns them (`RankLayout.owner_of`). Shards and columns arrive as
plain objects: the runtime hands the ranks Ray references, resolved by Ray before the call (values and
returns go from the owner rank of one group to the ranks of the other, never through the driver:
slime.driver.train_group); a backend never sees Ray.

The weights leave through `export_weights(bucket_bytes)`, an iterator of buckets of HF-named tensors
that every rank runs collectively; the source rank hands it to the weight-sync object (`update_weights`)
or writes an HF directory (`save_hf`). `save_checkpoint`/`load_checkpoint` keep the full training state;
`offload`/`onload` free and retake accelerator memory for colocated engines.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch

from slime.registry import TRAIN_BACKENDS
from slime.sync.base import SyncContext, connect_follower, connect_weight_sync
from slime.train.layout import RankLayout
from slime.train.shard import LoadedShard
from slime.train.train_setup import TrainSetup
from slime.types import TrainBatch
from slime.wire.hf_dir import write_hf_dir
from slime.wire.tensors import Bucket


class TrainBackend(abc.ABC):
    """One training rank of one role; see the module docstring for the call sequence.

    Args:
        setup: the role's typed setup.
        rank: this rank's index in the group (0 .. layout.world_size - 1).
        layout: the group's parallel sizes; `layout.coords(rank)` places this rank.
        master_addr, master_port: torch.distributed rendezvous of the group (rank 0's node).
    """

    role = "actor"

    def __init__(self, setup: TrainSetup, *, rank: int, layout: RankLayout, master_addr: str, master_port: int):
        self.setup = setup
        self.rank = rank
        self.layout = layout
        self.coords = layout.coords(rank)
        self.master_addr = master_addr
        self.master_port = master_port
        self.shard: LoadedShard | None = None  # the rollout step's data and columns, from load_batch
        self.device = torch.device("cpu")  # where columns live; a backend sets its own in init()
        self.weight_sync = None

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def batch(self) -> TrainBatch | None:
        """The loaded shard's samples (None before the first `load_batch`)."""
        return None if self.shard is None else self.shard.batch

    @property
    def columns(self) -> dict[str, torch.Tensor]:
        """The loaded shard's flat per-response-token columns (empty before the first `load_batch`)."""
        return {} if self.shard is None else self.shard.columns

    # ---- build, load, save -------------------------------------------------------------------
    @abc.abstractmethod
    def init(self) -> int:
        """Build the model (and optimizer), load `checkpoint.load` if set; return the first rollout id."""

    @abc.abstractmethod
    def load_checkpoint(self, root: str, ckpt_step: int | None) -> int:
        """Restore the training state saved under `root` (latest, or `ckpt_step`); return the next rollout id."""

    @abc.abstractmethod
    def save_checkpoint(self, rollout_id: int, root: str) -> None:
        """Save model, optimizer, scheduler and RNG for `rollout_id` under `root`; collective."""

    # ---- one rollout step --------------------------------------------------------------------
    def load_batch(self, rollout_id: int, batch: TrainBatch) -> None:
        """Hold this rank's data-parallel shard for the calls of one rollout step."""
        self.shard = LoadedShard(rollout_id, batch, self.device)

    def compute_log_probs(self, which: str) -> dict[str, float]:
        """Actor: forward-only log-probs of the response tokens, kept as column `<which>_log_probs`;
        `which` is "old" (the current policy) or "ref" (the reference model). Returns `perf/*` seconds."""
        raise NotImplementedError(f"{type(self).__name__} ({self.role}) computes no log-probs")

    def compute_values(self) -> list[list[float]]:
        """Critic: per sample of the shard, the value of every response token (old values)."""
        raise NotImplementedError(f"{type(self).__name__} ({self.role}) computes no values")

    def compute_advantages(self) -> dict[str, float]:
        """Actor: advantages and returns from the loaded columns; returns `rollout/<column>` means over
        every shard (the same on all ranks)."""
        raise NotImplementedError(f"{type(self).__name__} ({self.role}) computes no advantages")

    @abc.abstractmethod
    def train(self, *, update: bool = True) -> dict[str, Any]:
        """K optimizer steps on the loaded shard (none when `update` is False: PPO's critic-only warm-up).

        Returns {"steps": [one `train/*` metrics dict per optimizer step, reduced over all ranks],
        "perf": {timer: seconds}}.
        """

    def set_column(self, name: str, per_sample: list[list[float]]) -> None:
        """Set a per-token column of the loaded shard from per-sample lists (e.g. the critic's values)."""
        self.shard.columns[name] = torch.tensor(
            [v for sample in per_sample for v in sample], dtype=torch.float32, device=self.device
        )

    def get_column(self, name: str) -> list[list[float]] | None:
        """A per-token column of the loaded shard as per-sample lists (None if not computed)."""
        column = self.columns.get(name)
        if column is None:
            return None
        return [part.tolist() for part in torch.split(column.detach().cpu(), self.batch.response_lengths)]

    # ---- weights out -------------------------------------------------------------------------
    @abc.abstractmethod
    def export_weights(self, bucket_bytes: int) -> Iterator[Bucket]:
        """The full model as buckets of (HF name, tensor) of about `bucket_bytes` each; every rank runs
        it (it may gather collectively); the source rank's buckets are the ones used."""

    def export_adapter(self, bucket_bytes: int) -> Iterator[Bucket]:
        """What an adapter-only sync moves: the policy's LoRA adapter under peft's saved names
        (`base_model.model.<HF module>.lora_A.weight`, `lora_B.weight`) and the base weights trained beside it
        (`model.lora.train_params`, RMSNorm gains) under their HF names, in buckets of about `bucket_bytes`;
        collective like `export_weights`."""
        raise NotImplementedError(f"{type(self).__name__} trains no LoRA adapter")

    def connect_weight_sync(self, mode: str, engine_urls: Sequence[str], context: SyncContext) -> None:
        """Build the `rollout.weight_sync.mode` object on the source rank, which builds its own engine clients
        from `engine_urls`; other ranks hold the mode's follower, if it has one (`WeightSync.follower`)."""
        if self.weight_sync is not None:
            self.weight_sync.close()
            self.weight_sync = None
        if self.layout.is_source(self.rank):
            self.weight_sync = connect_weight_sync(mode, engine_urls, context)
        else:  # tensor mode with per-TP-rank handles: this rank stages its own (slime.sync.tensor)
            self.weight_sync = connect_follower(mode, context, self.rank)

    def update_weights(self, weight_version: int) -> dict[str, float]:
        """Push the current weights (with `model.lora` synced alone: the adapter) to every engine (collective);
        `perf/*` timings from the source rank."""
        export = self.export_adapter if self.setup.model.lora.synced_alone else self.export_weights
        buckets = export(self.weight_sync.context.bucket_bytes if self.weight_sync else 1 << 29)
        if self.weight_sync is None:
            for _ in buckets:  # take part in the gathers
                pass
            return {}
        if not self.layout.is_source(self.rank):  # a TensorHandleFollower
            self.weight_sync.follow(buckets)
            return {}
        return self.weight_sync.push(buckets, weight_version=weight_version)

    def weights_verified(self) -> dict[str, float]:
        """Await the check of the last push that runs beside generation (`SyncContext.defer_verify`): its
        `perf/*` seconds from the source rank; WeightMismatchError when an engine holds other weights."""
        if self.weight_sync is None or not self.layout.is_source(self.rank):
            return {}
        return self.weight_sync.verified()

    def save_hf(self, path: str) -> None:
        """HF directory (safetensors + index + config + tokenizer) at `path`; collective, the source rank writes."""
        buckets = self.export_weights(1 << 29)
        if self.layout.is_source(self.rank):
            write_hf_dir(buckets, path, source_checkpoint=self.setup.model.hf_checkpoint)
        else:
            for _ in buckets:
                pass

    def close_weight_sync(self) -> None:
        if self.weight_sync is not None:
            self.weight_sync.close()
            self.weight_sync = None

    # ---- memory and teardown -----------------------------------------------------------------
    def offload(self) -> None:
        """Free accelerator memory for a colocated engine (no-op on CPU)."""

    def onload(self) -> None:
        """Take accelerator memory back after `offload` (no-op on CPU)."""

    def shutdown(self) -> None:
        """Release process groups and other resources."""
        self.close_weight_sync()


P = ParamSpec("P")
R = TypeVar("R")
BackendMethod = Callable[Concatenate[Any, P], R]  # a function of a backend class, e.g. TrainBackend.train


def call_backend(backend: TrainBackend, method: BackendMethod[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`method(*args, **kwargs)` as `backend` implements it: `method` is a function of the backend's classes
    (`TrainBackend.train`, or a subclass's own), the call runs the most derived override of it.

    The runtime sends ranks such references, never method names: a call site names the interface function it
    calls, so its parameters are checked and its callers found. Raises TypeError for a function the backend's
    classes do not define (a plain function, another class's method)."""
    name = getattr(method, "__name__", None)
    if not any(vars(cls).get(name) is method for cls in type(backend).__mro__):
        raise TypeError(f"{method!r} is not a method of {type(backend).__name__} or its bases")
    return getattr(backend, name)(*args, **kwargs)


def get_backend_class(name: str, role: str = "actor") -> type[TrainBackend]:
    """The class registered for `parallelism.backend=<name>` and `role` (actor | critic)."""
    return TRAIN_BACKENDS.load(name, role)
