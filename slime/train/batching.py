"""Micro-batching of a `TrainBatch`: which samples of an optimizer step share a forward/backward.

Two modes (docs/architecture.md#batch-vocabulary): fixed `micro_batch_size` samples, or dynamic bins of at most
`max_tokens_per_gpu` tokens (prompt + response), which wins when set. Step-level loss weights make the
step's losses and gradients independent of the split either way.
"""

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


def token_bins(indices: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    """First-fit-decreasing bins of ≤ `max_tokens` tokens over samples `indices` (`lengths[i]`: tokens
    of sample i); a longer sample gets a bin of its own. Deterministic: samples are placed longest
    first, ties by position in `indices`; each bin keeps its samples in `indices` order, and bins are
    ordered by their first sample's position in `indices`.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    position = {i: p for p, i in enumerate(indices)}
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(indices, key=lambda i: (-lengths[i], position[i])):
        for b, load in enumerate(loads):
            if load + lengths[i] <= max_tokens:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return sorted((sorted(b, key=position.__getitem__) for b in bins), key=lambda b: position[b[0]])


def split(indices: list[int], lengths: list[int], *, micro_batch_size: int, max_tokens: int | None) -> list[list[int]]:
    """The micro-batches of one step's samples: token bins when `max_tokens` is set, else consecutive
    chunks of `micro_batch_size` samples."""
    if max_tokens is not None:
        return token_bins(indices, lengths, max_tokens)
    return micro_batches(indices, micro_batch_size)


def micro_batch_extent(batch: TrainBatch, *, micro_batch_size: int, max_tokens: int | None) -> tuple[int, int]:
    """(the tokens (prompt + response) of the fullest micro-batch `split` makes of the batch's optimizer steps, the
    most micro-batches one step takes): what a rank's activations were sized by, against the plan's full
    micro-batches, and whether a later micro-batch's activations sat on the earlier ones' gradients
    (slime.plan.memory)."""
    lengths = [len(t) for t in batch.tokens]
    steps = [
        split(step, lengths, micro_batch_size=micro_batch_size, max_tokens=max_tokens) for step in step_indices(batch)
    ]
    fullest = max((sum(lengths[i] for i in micro) for bins in steps for micro in bins), default=0)
    return fullest, max((len(bins) for bins in steps), default=0)


def largest_micro_batch(batch: TrainBatch, *, micro_batch_size: int, max_tokens: int | None) -> int:
    """The tokens of the fullest micro-batch of the batch's optimizer steps (`micro_batch_extent`)."""
    return micro_batch_extent(batch, micro_batch_size=micro_batch_size, max_tokens=max_tokens)[0]


def pad_to(micro: list[list[int]], count: int) -> list[list[int]]:
    """Append empty micro-batches up to `count`: every DP rank then runs the same number of forwards,
    which FSDP2's per-layer collectives need (an empty one runs a dummy forward with zero loss)."""
    return micro + [[] for _ in range(count - len(micro))]


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
    return torch.cat([column[starts[i] : starts[i + 1]] for i in indices])
