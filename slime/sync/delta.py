"""Delta pushes (`rollout.weight_sync.delta`): after a full push, a push carries only the bits that changed
(docs/engines.md#delta-pushes).

The trainer keeps a copy of every tensor it last pushed. A delta push replaces each tensor of a bucket by the pair
`<name>@delta.gaps`, `<name>@delta.values` (as bytes: `slime.wire.weight_delta.gap_delta` between the last pushed
bits and the new ones, both as the engines hold them, in their serving dtype, which the verification of the first
full push learnt), leaves out tensors whose bits did not change, and the engine writes the changed bits into its
weights in place. Every `full_every`-th push is full, and so is the first push of a sync object (a fresh run, an engine restarted
and the sync reconnected), any push after a failed one, and any push while the engines' dtype is unknown. The
verification of every push compares whole tensors, so a delta push is checked bit for bit like a full one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from slime.wire.tensors import Bucket
from slime.wire.weight_delta import DELTA_GAPS, DELTA_VALUES, gap_delta


class DeltaPushes:
    """The trainer's side of delta pushes for one sync object: what it last pushed, and when a full push is due."""

    def __init__(self, full_every: int):
        self.full_every = full_every
        self.held: dict[str, torch.Tensor] = {}  # each tensor as last pushed (the trainer's dtype)
        self.since_full: int | None = None  # pushes since the last full one; None: a full push is due
        self.changed = self.elements = 0  # elements carried / elements pushed, of the last push

    def full_due(self, served: torch.dtype | None) -> bool:
        return served is None or self.since_full is None or self.since_full + 1 >= self.full_every

    def encode(self, buckets: Iterable[Bucket], served: torch.dtype | None) -> Iterator[Bucket]:
        """The push's buckets as they travel: whole on a full push (and remembered), else as deltas against what was
        last pushed, in `served` (the engines' dtype). Buckets with no changed bit are not sent."""
        full = self.full_due(served)
        self.changed = self.elements = 0
        for bucket in buckets:
            out: Bucket = []
            for name, tensor in bucket:
                self.elements += tensor.numel()
                last = self.held.get(name)
                if full or last is None or last.shape != tensor.shape:
                    out.append((name, tensor))
                    self.changed += tensor.numel()
                else:
                    gaps, values = gap_delta(last.to(served), tensor.to(served))
                    if gaps.numel():  # as bytes: NCCL and gloo broadcast no int16
                        out += [
                            (name + DELTA_GAPS, gaps.view(torch.uint8)),
                            (name + DELTA_VALUES, values.view(torch.uint8)),
                        ]
                        self.changed += gaps.numel()
                self._remember(name, tensor)
            if out:
                yield out
        self.since_full = 0 if full else self.since_full + 1

    def _remember(self, name: str, tensor: torch.Tensor) -> None:
        held = self.held.get(name)
        if held is None or held.shape != tensor.shape or held.dtype != tensor.dtype:
            self.held[name] = tensor.detach().clone()
        else:
            held.copy_(tensor)

    def failed(self) -> None:
        """A push failed: what the engines hold is unknown, so the next push is full."""
        self.since_full = None

    def metrics(self) -> dict[str, float]:
        return {"perf/update_weights_changed_fraction": self.changed / max(self.elements, 1)}
