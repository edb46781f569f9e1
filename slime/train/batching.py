"""Micro-batching and padding of a `TrainBatch` for backends that run padded [B, S] forwards."""

from __future__ import annotations

import torch
from torch import Tensor

from slime.types import TrainBatch


def step_indices(batch: TrainBatch) -> list[list[int]]:
    """Sample indices of each optimizer step, in order (steps 0..K-1)."""
    steps: dict[int, list[int]] = {}
    for i, step in enumerate(batch.step_ids):
        steps.setdefault(step, []).append(i)
    return [steps[k] for k in sorted(steps)]


def micro_batches(indices: list[int], micro_batch_size: int) -> list[list[int]]:
    """Split `indices` into consecutive chunks of at most `micro_batch_size` samples."""
    return [indices[i : i + micro_batch_size] for i in range(0, len(indices), micro_batch_size)]


def pad_right(token_lists: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """[B] ragged ids -> (input_ids Tensor[B, S] int64, attention_mask Tensor[B, S]), right-padded."""
    longest = max(len(t) for t in token_lists)
    ids = torch.full((len(token_lists), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(token_lists), longest), dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[row, : len(tokens)] = 1
    return ids.to(device), mask.to(device)


def response_rows(logits: Tensor, input_ids: Tensor, batch: TrainBatch, indices: list[int]) -> tuple[Tensor, Tensor]:
    """Gather the logits rows that score each response token and the targets they score.

    logits: Tensor[B, S, V] for the padded micro-batch `indices`. Response token j of a sample with
    prompt length P sits at position P+j and is predicted by logits at P−1+j (REFERENCE.md §3.4).
    Returns (rows Tensor[T, V], targets Tensor[T]) flat over the micro-batch's response tokens.
    """
    rows, targets = [], []
    for b, i in enumerate(indices):
        length, response = len(batch.tokens[i]), batch.response_lengths[i]
        prompt = length - response
        rows.append(logits[b, prompt - 1 : length - 1])
        targets.append(input_ids[b, prompt:length])
    return torch.cat(rows), torch.cat(targets)


def flat(values: list[list[float]] | list[list[int]], indices: list[int], *, dtype, device) -> Tensor:
    """Concatenate per-sample token lists of `indices` into one flat Tensor[T]."""
    return torch.tensor([v for i in indices for v in values[i]], dtype=dtype, device=device)


def offsets(lengths: list[int]) -> list[int]:
    """Start of each sample's tokens in a flat column, plus the total: [0, l0, l0+l1, ...]."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def pick(column: Tensor | None, starts: list[int], indices: list[int]) -> Tensor | None:
    """The tokens of samples `indices` from a flat per-token column (None stays None)."""
    if column is None:
        return None
    return torch.cat([column[starts[i]:starts[i + 1]] for i in indices])
