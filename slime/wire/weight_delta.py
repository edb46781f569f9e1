"""Bitwise weight deltas: what a delta sync would move.

A trainer exports bf16 (or fp32) copies of fp32 master weights; after a small optimizer step most exported values
round to the very bits they had, so a push need carry only the elements whose bits changed. Everything here compares
and carries raw bits (each tensor viewed as the signed integer of its element width), so a delta is lossless by
construction: NaN payloads, -0.0 and +0.0 all survive, and `apply_delta(old, delta_of(old, new))` is `new` bit for
bit. What each side holds is checked with `slime.wire.weight_digest`.

    SparseDelta   (positions of the changed elements, their new bits): what travels
    delta_of      old, new -> SparseDelta        apply_delta   old, SparseDelta -> new (in place)
"""

from __future__ import annotations

import dataclasses

import torch

_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as the signed integers of their bits, flat (a view when contiguous)."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.int8)
    return flat.view(_BITS[flat.element_size()])


@dataclasses.dataclass(frozen=True)
class SparseDelta:
    """The elements whose bits changed: `positions` (int64, into the flat tensor) and their new `values` (the
    tensor's integer view of its dtype). `nbytes` is what it carries."""

    positions: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return (
            self.positions.numel() * 4 + self.values.numel() * self.values.element_size()
        )  # int32 positions on the wire


def delta_of(old: torch.Tensor, new: torch.Tensor) -> SparseDelta:
    """What turns `old` into `new` bit for bit (same shape and dtype)."""
    if old.shape != new.shape or old.dtype != new.dtype:
        raise ValueError(
            f"a delta needs equal shapes and dtypes: {tuple(old.shape)} {old.dtype} vs {tuple(new.shape)} {new.dtype}"
        )
    a, b = bits(old), bits(new)
    positions = torch.nonzero(a != b).reshape(-1)
    return SparseDelta(positions=positions, values=b[positions])


def apply_delta(target: torch.Tensor, delta: SparseDelta) -> torch.Tensor:
    """Write `delta`'s values into `target` (contiguous, the old weights) in place; returns it."""
    if not target.is_contiguous():
        raise ValueError("apply_delta writes in place: the target must be contiguous")
    bits(target)[delta.positions.to(target.device)] = delta.values.to(target.device)
    return target


def changed_fraction(old: torch.Tensor, new: torch.Tensor) -> float:
    """The share of elements whose bits differ."""
    return float((bits(old) != bits(new)).sum()) / max(old.numel(), 1)


MAX_GAP = 65535  # the largest step between two carried positions: 16 bits


def gap_delta(old: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What turns `old` into `new` bit for bit, as a delta sync carries it: (gaps, values). `gaps` (int16 holding
    unsigned 16-bit steps) are the distances from one carried position to the next, the first from -1; where two
    changed elements lie more than MAX_GAP apart, unchanged elements between them are carried too (their own bits), so
    no step exceeds 16 bits. `values` are the new bits at those positions (`bits`). 2 + the element size bytes per
    carried element, on the tensors' device."""
    positions = delta_of(old, new).positions
    steps = torch.diff(positions, prepend=positions.new_full((1,), -1))
    fillers = torch.div(steps - 1, MAX_GAP, rounding_mode="floor")
    if positions.numel() and int(fillers.max()) > 0:
        counts = fillers + 1
        owner = torch.repeat_interleave(torch.arange(positions.numel(), device=positions.device), counts)
        rank = torch.arange(owner.numel(), device=positions.device) - (torch.cumsum(counts, 0) - counts)[owner]
        before = (positions - steps)[owner]
        positions = torch.where(rank < fillers[owner], before + MAX_GAP * (rank + 1), positions[owner])
        steps = torch.diff(positions, prepend=positions.new_full((1,), -1))
    return steps.to(torch.int32).to(torch.int16), bits(new)[positions]


def apply_gap_delta(target: torch.Tensor, gaps: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Write a `gap_delta` into `target` (the old weights, any layout) in place; returns it."""
    steps = gaps.to(target.device).to(torch.int64) & MAX_GAP
    positions = torch.cumsum(steps, 0) - 1
    if target.is_contiguous():
        bits(target)[positions] = values.to(target.device)
        return target
    whole = target.contiguous()
    bits(whole)[positions] = values.to(target.device)
    target.copy_(whole)
    return target


# A delta push's tensor names: `<HF name>` + each suffix carries that tensor's `gap_delta` (slime.sync.delta)
DELTA_GAPS, DELTA_VALUES = "@delta.gaps", "@delta.values"
