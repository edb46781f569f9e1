"""Private helpers for the flat ragged token layout (see ``slime.algo`` docstring).

A batch of B samples is a flat 1-D tensor of T = sum(response_lengths) tokens, sample 0's
response tokens first. These helpers validate and convert that layout.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_lengths(response_lengths: list[int]) -> list[int]:
    """Return ``response_lengths`` as a list of ints; raise ValueError if any is negative."""
    lengths = [int(n) for n in response_lengths]
    if any(n < 0 for n in lengths):
        raise ValueError(f"response_lengths must be non-negative, got {lengths}")
    return lengths


def check_flat(x: Tensor, response_lengths: list[int], name: str) -> None:
    """Raise ValueError unless ``x`` is 1-D with numel == sum(response_lengths)."""
    total = sum(response_lengths)
    if x.dim() != 1 or x.numel() != total:
        raise ValueError(
            f"{name} must be a flat 1-D tensor of sum(response_lengths)={total} tokens, got shape {tuple(x.shape)}"
        )


def check_per_sample(x: Tensor, response_lengths: list[int], name: str) -> None:
    """Raise ValueError unless ``x`` is 1-D with one entry per sample."""
    if x.dim() != 1 or x.numel() != len(response_lengths):
        raise ValueError(
            f"{name} must be a 1-D tensor of B={len(response_lengths)} per-sample values, got shape {tuple(x.shape)}"
        )


def sample_ids(response_lengths: list[int], device: torch.device) -> Tensor:
    """Tensor[T] of int64: the sample index of each flat token."""
    counts = torch.tensor(response_lengths, dtype=torch.long, device=device)
    return torch.repeat_interleave(torch.arange(len(response_lengths), device=device), counts)


def segment_sum(x: Tensor, response_lengths: list[int]) -> Tensor:
    """Tensor[T] -> Tensor[B]: per-sample sum of a flat token tensor (differentiable)."""
    ids = sample_ids(response_lengths, x.device)
    out = torch.zeros(len(response_lengths), dtype=x.dtype, device=x.device)
    return out.index_add(0, ids, x)


def pad(x: Tensor, response_lengths: list[int]) -> Tensor:
    """Tensor[T] -> Tensor[B, L_max], zero-padded on the right."""
    b, l_max = len(response_lengths), max(response_lengths, default=0)
    out = x.new_zeros(b, l_max)
    mask = torch.arange(l_max, device=x.device)[None, :] < torch.tensor(response_lengths, device=x.device)[:, None]
    return out.masked_scatter(mask, x)


def unpad(x: Tensor, response_lengths: list[int]) -> Tensor:
    """Tensor[B, L_max] -> Tensor[T], dropping the right padding."""
    l_max = x.shape[1]
    mask = torch.arange(l_max, device=x.device)[None, :] < torch.tensor(response_lengths, device=x.device)[:, None]
    return x[mask]


def reverse_discounted_cumsum(x: Tensor, discount: float) -> Tensor:
    """Tensor[B, L] -> Tensor[B, L] with out[:, t] = sum_{k>=t} discount**(k-t) * x[:, k].

    Right padding must be zero so that it contributes nothing. Vectorised over B, one
    step per position (exact recursion ``out_t = x_t + discount * out_{t+1}``).
    """
    cols: list[Tensor] = []
    running = x.new_zeros(x.shape[0])
    for t in range(x.shape[1] - 1, -1, -1):
        running = x[:, t] + discount * running
        cols.append(running)
    if not cols:
        return x.clone()
    return torch.stack(cols[::-1], dim=1)
