"""Validation of the weight-sync modes: the checks of their registry records (slime.registry.WEIGHT_SYNC),
run by slime/plan/validate.py before anything starts. No torch at import."""

from __future__ import annotations

from collections.abc import Iterator

from slime.config.problems import Problem
from slime.config.schema import RunConfig


def check_disk_unchosen(cfg: RunConfig) -> Iterator[Problem]:
    """`keep` is disk mode's option: only disk mode writes weight directories."""
    ws = cfg.rollout.weight_sync
    if ws.keep:
        yield Problem(
            "rollout.weight_sync.keep",
            True,
            f"only disk mode writes weight directories to keep; mode={ws.mode!r}",
            "set rollout.weight_sync.keep=false or rollout.weight_sync.mode=disk",
        )


def check_tensor(cfg: RunConfig) -> Iterator[Problem]:
    """Tensor mode needs the engines on the trainer's node and devices."""
    c = cfg.cluster
    if not c.colocate:
        yield Problem(
            "rollout.weight_sync.mode",
            "tensor",
            "tensor mode hands weights over in shared memory / CUDA IPC, "
            "so the engines must share the trainer's node and devices (cluster.colocate=false)",
            "set cluster.colocate=true, or rollout.weight_sync.mode=distributed (or disk)",
        )
    if c.num_nodes > 1:
        yield Problem(
            "rollout.weight_sync.mode",
            "tensor",
            f"tensor mode hands every bucket from the source rank's node "
            f"to the engines; cluster.num_nodes={c.num_nodes} puts engines on other nodes",
            "set rollout.weight_sync.mode=distributed (or disk), or cluster.num_nodes=1",
        )
