"""Non-finite values in training: a NaN or inf in a step's loss or gradients is skipped or stops the run
(`train.on_nonfinite`), naming the step and the first non-finite tensor; a model holding a non-finite parameter is
never saved as a checkpoint nor pushed to the engines."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

import torch


class NonFiniteError(RuntimeError):
    """A NaN or inf where training needs finite values; the message names the step and the tensor."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (each rank checks its own), else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def first_nonfinite(tensors: Iterable[tuple[str, Optional[torch.Tensor]]]) -> Optional[str]:
    """The name of the first tensor holding a NaN or inf (None tensors skipped); None when all are finite."""
    for name, tensor in tensors:
        if tensor is not None and not bool(torch.isfinite(_local(tensor).detach()).all()):
            return name
    return None


def nonfinite_gradient(model: torch.nn.Module) -> Optional[str]:
    """'the gradient of <parameter>' for the first parameter whose gradient is not finite, or None."""
    name = first_nonfinite((n, p.grad) for n, p in model.named_parameters())
    return None if name is None else f"the gradient of {name}"


def check_finite_parameters(model: torch.nn.Module, what: str) -> None:
    """NonFiniteError before `what` (a checkpoint save, a weight push) when a parameter holds a NaN or inf."""
    name = first_nonfinite((n, p) for n, p in model.named_parameters())
    if name is not None:
        raise NonFiniteError(
            f"{what} refused: parameter {name} holds a NaN or inf; a non-finite model is never saved nor pushed to "
            "the engines (lower train.lr, or set train.on_nonfinite=skip to drop such steps)"
        )
